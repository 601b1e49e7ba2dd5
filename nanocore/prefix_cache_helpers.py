"""Deprecated: moved to the public toolkit (``nanocore.toolkit.prefix_cache``); removed in 2.0."""
import warnings

from nanocore.toolkit.prefix_cache import *  # noqa: F401,F403

warnings.warn("nanocore.prefix_cache_helpers is deprecated: import from nanocore.toolkit.prefix_cache (the public plugin toolkit)", DeprecationWarning, stacklevel=2)
