"""nanocore-awq: the ``awq`` linear method (W4A16, AutoAWQ GEMM format) and its activation-aware quantizer."""
from nanocore_awq.method import AWQLinearMethod

__all__ = ["AWQLinearMethod"]
