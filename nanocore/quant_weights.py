"""Deprecated: moved to the public toolkit (``nanocore.toolkit.weights``); removed in 2.0."""
import warnings

from nanocore.toolkit.weights import *  # noqa: F401,F403

warnings.warn("nanocore.quant_weights is deprecated: import from nanocore.toolkit.weights (the public plugin toolkit)", DeprecationWarning, stacklevel=2)
