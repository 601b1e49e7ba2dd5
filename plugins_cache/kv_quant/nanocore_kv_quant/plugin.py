"""Registers the quantized KV codecs with nanocore."""
from nanocore.hookspecs import hookimpl
from nanocore_kv_quant.codecs import Fp8E4M3KVCodec, Int8KVCodec, KInt8VFp8KVCodec


@hookimpl
def nanocore_kv_codecs():
    return {"int8": Int8KVCodec, "fp8_e4m3": Fp8E4M3KVCodec, "k_int8_v_fp8": KInt8VFp8KVCodec}
