"""Quantized KV codecs for nanocore: ``int8``, ``fp8_e4m3`` and ``k_int8_v_fp8``."""
from nanocore_kv_quant.codecs import Fp8E4M3KVCodec, Int8KVCodec, KInt8VFp8KVCodec, ScaledKVCodec

__all__ = ["ScaledKVCodec", "Int8KVCodec", "Fp8E4M3KVCodec", "KInt8VFp8KVCodec"]
