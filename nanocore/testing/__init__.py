"""Test helpers shared by plugin test suites (reference models, simulated engine state); needs hypothesis."""
