"""Deprecated: moved to the public toolkit (``nanocore.toolkit.gemm``); removed in 2.0."""
import warnings

from nanocore.toolkit.gemm import *  # noqa: F401,F403

warnings.warn("nanocore.kernels.quant_gemm is deprecated: import from nanocore.toolkit.gemm (the public plugin toolkit)",
              DeprecationWarning, stacklevel=2)
