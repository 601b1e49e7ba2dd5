"""nanocore-int8: ``int8_w8a8`` (torch._int_mm, int8 activations) and ``int8_w8a16`` (weight-only, Triton)."""
from nanocore_int8.methods import Int8W8A8LinearMethod, Int8W8A16LinearMethod

__all__ = ["Int8W8A8LinearMethod", "Int8W8A16LinearMethod"]
