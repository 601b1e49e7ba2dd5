"""nanocore-cutlass: linear method ``cutlass``, FP8 W8A8 on a CUTLASS 3.x sm_90a kernel compiled on first use."""
from nanocore_cutlass.method import CutlassFp8LinearMethod

__all__ = ["CutlassFp8LinearMethod"]
