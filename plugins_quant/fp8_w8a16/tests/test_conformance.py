"""The shared linear-method conformance suite for both methods of this distribution."""
from nanocore_conformance import LinearMethodConformance


class TestFp8W8A16(LinearMethodConformance):
    backend = "fp8_w8a16"


class TestFp8W8A8(LinearMethodConformance):
    backend = "fp8_w8a8"
