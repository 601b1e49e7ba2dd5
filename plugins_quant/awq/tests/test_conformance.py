"""The shared linear-method conformance suite for ``awq`` (K in groups of 128, N in packs of 8)."""
from nanocore_conformance import LinearMethodConformance


class TestAWQ(LinearMethodConformance):
    backend = "awq"  # input/output size multiples come from AWQLinearMethod.conformance_requirements


class TestWNA16(LinearMethodConformance):
    backend = "wna16"  # its quantize writes compressed-tensors pack-quantized int4 (group 128, symmetric)
