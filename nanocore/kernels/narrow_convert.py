"""One-byte (int8 / fp8 e4m3) tiles -> fp16 in registers, for the fp16 attention paths of ``narrow_attention``.

Every int8 and e4m3 value is exact in fp16, so each conversion below is exact.
``CVT`` 0 is plain ``.to(fp16)``: the interpreter, and the reference the bit tricks reproduce exactly.
``CVT`` 1 is a few integer instructions per four bytes (``prmt``, ``lop3``); fp8 comes out divided by ``FP8_BITS_UNIT``.
``CVT`` 2 is the e4m3x2 -> f16x2 instruction (sm_89+) for fp8; int8 takes the ``CVT`` 1 bit trick.
"""
from __future__ import annotations

import triton
import triton.language as tl

#: fp8 values come out of the ``CVT`` 1 bit trick divided by this (e4m3 bias 7 vs fp16 bias 15).
FP8_BITS_UNIT = 256.0


def _int8_ptx(lo: str, hi: str, src: str) -> str:
    """Four int8 in ``src`` -> fp16x2 ``lo`` (bytes 0, 1) and ``hi`` (bytes 2, 3), exactly: ``x + 128`` becomes the
    low byte of fp16 ``1024 + (x + 128)``, minus 1152. Needs ``.reg .b32 u, c``."""
    return f"""
        xor.b32 u, {src}, 0x80808080;
        prmt.b32 {lo}, u, 0x64646464, 0x4140;
        prmt.b32 {hi}, u, 0x64646464, 0x4342;
        mov.b32 c, 0x64806480;
        sub.f16x2 {lo}, {lo}, c;
        sub.f16x2 {hi}, {hi}, c;"""


def _fp8_ptx(lo: str, hi: str, src: str) -> str:
    """Four e4m3 in ``src`` -> fp16x2 ``lo`` / ``hi`` holding value / 256: sign to bit 15, exponent and mantissa
    shifted by 7. Needs ``.reg .b32 w0, w1, t0, t1``."""
    return f"""
        prmt.b32 w0, {src}, 0, 0x1404;
        prmt.b32 w1, {src}, 0, 0x3424;
        shr.b32 t0, w0, 1;
        shr.b32 t1, w1, 1;
        and.b32 t0, t0, 0x3F803F80;
        and.b32 t1, t1, 0x3F803F80;
        lop3.b32 {lo}, w0, 0x80008000, t0, 0xEA;
        lop3.b32 {hi}, w1, 0x80008000, t1, 0xEA;"""


# 4 bytes in $2 -> two fp16x2 in $0 / $1 (``pack=4``)
INT8_PACKED_ASM = tl.constexpr("{ .reg .b32 u, c;" + _int8_ptx("$0", "$1", "$2") + " }")
FP8_PACKED_ASM = tl.constexpr("{ .reg .b32 w0, w1, t0, t1;" + _fp8_ptx("$0", "$1", "$2") + " }")


@triton.jit
def _int8_to_f16_bits(x):
    """int8 -> fp16 exactly (``_int8_ptx``)."""
    return tl.inline_asm_elementwise(asm=INT8_PACKED_ASM, constraints="=r,=r,r", args=[x], dtype=tl.float16,
                                     is_pure=True, pack=4)


@triton.jit
def _fp8_to_f16_bits(x):
    """e4m3 bits (as int8) -> fp16 holding value / 256 (``_fp8_ptx``)."""
    return tl.inline_asm_elementwise(asm=FP8_PACKED_ASM, constraints="=r,=r,r", args=[x], dtype=tl.float16,
                                     is_pure=True, pack=4)


@triton.jit
def narrow_to_f16(x, IS_INT8: tl.constexpr, CVT: tl.constexpr):
    """One-byte tile -> fp16. ``CVT`` 1 returns fp8 values divided by ``FP8_BITS_UNIT`` (callers fold it)."""
    if CVT != 0 and IS_INT8:
        y = _int8_to_f16_bits(x)
    elif CVT == 1:
        y = _fp8_to_f16_bits(x.to(tl.int8, bitcast=True))
    else:  # CVT 0, and fp8 with CVT 2: the hardware conversion
        y = x.to(tl.float16)
    return y

