"""GPU diagnostics, checks and the GPU suite (not installed): run from the repository root, e.g.
``python -m benchmarks.step_profile`` or ``bash benchmarks/gpu_suite.sh OUTDIR SECTION``; see README.md."""
