"""The shared conformance suite for the quantized KV codecs."""
from nanocore_conformance import KVCodecConformance


class TestInt8(KVCodecConformance):
    backend = "int8"


class TestFp8E4M3(KVCodecConformance):
    backend = "fp8_e4m3"


class TestKInt8VFp8(KVCodecConformance):
    backend = "k_int8_v_fp8"
    head_dims = (32, 64, 128)  # multiples of the K scale group (32)
