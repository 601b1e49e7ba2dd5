"""The version of nanocore, readable without importing the package (the plugin registry checks requirements on it)."""
__version__ = "1.6.0"
