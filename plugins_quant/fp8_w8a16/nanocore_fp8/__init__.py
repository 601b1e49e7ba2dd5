"""nanocore-fp8: fp8 e4m3 linear methods ``fp8_w8a16`` (Triton dequantizing GEMM) and ``fp8_w8a8`` (torch._scaled_mm)."""
from nanocore_fp8.methods import Fp8W8A8LinearMethod, Fp8W8A16LinearMethod

__all__ = ["Fp8W8A16LinearMethod", "Fp8W8A8LinearMethod"]
