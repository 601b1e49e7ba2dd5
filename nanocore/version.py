"""The core's version, in a module of its own so that the registry can read it without importing the package."""

__version__ = "1.4.0"
