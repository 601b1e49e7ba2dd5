"""One-byte (int8 / fp8 e4m3) tiles -> fp16 in registers, for the fp16 attention paths of ``narrow_attention``.

Every int8 and e4m3 value is exact in fp16, so each conversion below is exact.
``CVT`` 0 is plain ``.to(fp16)``: the interpreter, and the reference the bit tricks reproduce exactly.
``CVT`` 1 is a few integer instructions per four bytes (``prmt``, ``lop3``); fp8 comes out divided by ``FP8_BITS_UNIT``.
``CVT`` 2 is the e4m3x2 -> f16x2 instruction (sm_89+) for fp8; int8 takes the ``CVT`` 1 bit trick.
``_words_to_f16`` converts int32 words of four bytes, so a tile read as words reaches shared memory as fp16.
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


_SPLIT_WORDS = "mov.b32 {$0, $1}, lo; mov.b32 {$2, $3}, hi;"  # two fp16x2 -> four fp16 outputs
# packed: 4 bytes in $2 -> two fp16x2 in $0 / $1 (``pack=4``); words: one int32 word in $4 -> four fp16 $0..$3
INT8_PACKED_ASM = tl.constexpr("{ .reg .b32 u, c;" + _int8_ptx("$0", "$1", "$2") + " }")
FP8_PACKED_ASM = tl.constexpr("{ .reg .b32 w0, w1, t0, t1;" + _fp8_ptx("$0", "$1", "$2") + " }")
INT8_WORDS_ASM = tl.constexpr("{ .reg .b32 u, c, lo, hi;" + _int8_ptx("lo", "hi", "$4") + _SPLIT_WORDS + " }")
FP8_WORDS_ASM = tl.constexpr("{ .reg .b32 w0, w1, t0, t1, lo, hi;" + _fp8_ptx("lo", "hi", "$4") + _SPLIT_WORDS + " }")


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


@triton.jit
def _words_to_f16(w, IS_INT8: tl.constexpr, CVT: tl.constexpr):
    """int32 words of 4 one-byte values -> 4 fp16 tensors (bytes 0..3), same conversions as ``narrow_to_f16``."""
    if CVT == 0 and IS_INT8:  # arithmetic shifts sign-extend each byte
        b0 = ((w << 24) >> 24).to(tl.float16)
        b1 = ((w << 16) >> 24).to(tl.float16)
        b2 = ((w << 8) >> 24).to(tl.float16)
        b3 = (w >> 24).to(tl.float16)
    elif CVT == 0:
        b0 = (w & 0xFF).to(tl.int8).to(tl.float8e4nv, bitcast=True).to(tl.float16)
        b1 = ((w >> 8) & 0xFF).to(tl.int8).to(tl.float8e4nv, bitcast=True).to(tl.float16)
        b2 = ((w >> 16) & 0xFF).to(tl.int8).to(tl.float8e4nv, bitcast=True).to(tl.float16)
        b3 = ((w >> 24) & 0xFF).to(tl.int8).to(tl.float8e4nv, bitcast=True).to(tl.float16)
    elif IS_INT8:
        b0, b1, b2, b3 = tl.inline_asm_elementwise(asm=INT8_WORDS_ASM, constraints="=h,=h,=h,=h,r", args=[w],
                                                   dtype=(tl.float16,) * 4, is_pure=True, pack=1)
    elif CVT == 1:
        b0, b1, b2, b3 = tl.inline_asm_elementwise(asm=FP8_WORDS_ASM, constraints="=h,=h,=h,=h,r", args=[w],
                                                   dtype=(tl.float16,) * 4, is_pure=True, pack=1)
    else:
        b0, b1, b2, b3 = tl.inline_asm_elementwise(
            asm="""
            {
            .reg .b16 a, b;
            .reg .b32 lo, hi;
            mov.b32 {a, b}, $4;
            cvt.rn.f16x2.e4m3x2 lo, a;
            cvt.rn.f16x2.e4m3x2 hi, b;
            mov.b32 {$0, $1}, lo;
            mov.b32 {$2, $3}, hi;
            }
            """,
            constraints="=h,=h,=h,=h,r", args=[w], dtype=(tl.float16,) * 4, is_pure=True, pack=1)
    return b0, b1, b2, b3
