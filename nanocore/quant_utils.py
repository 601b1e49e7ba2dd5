"""Deprecated: moved to the public toolkit (``nanocore.toolkit.numerics``, ``nanocore.toolkit.checkpoint``); removed in 2.0."""
import warnings

from nanocore.toolkit.checkpoint import *  # noqa: F401,F403
from nanocore.toolkit.numerics import *  # noqa: F401,F403

warnings.warn("nanocore.quant_utils is deprecated: import from nanocore.toolkit.numerics / nanocore.toolkit.checkpoint (the public plugin toolkit)", DeprecationWarning, stacklevel=2)
