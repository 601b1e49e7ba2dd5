"""The shared linear-method conformance suite for both methods of this distribution."""
from nanocore_conformance import LinearMethodConformance


class TestInt8W8A8(LinearMethodConformance):
    backend = "int8_w8a8"


class TestInt8W8A16(LinearMethodConformance):
    backend = "int8_w8a16"

