"""SiLU-and-mul of the MLP: ``silu(x[..., :I]) * x[..., I:]``.

The numbers follow ``silu_and_mul_reference`` in nanocore/layers/activation.py: silu in fp32 rounded to
the input dtype (as ``F.silu`` does), then the product rounded once.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def silu_and_mul_kernel(x_ptr, out_ptr, x_stride, I, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < I
    gate = tl.load(x_ptr + row * x_stride + cols, mask=ok, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * x_stride + I + cols, mask=ok, other=0.0).to(tl.float32)
    ty = out_ptr.dtype.element_ty
    silu = tl.div_rn(gate, 1.0 + tl.exp(-gate)).to(ty).to(tl.float32)  # torch: x / (1 + exp(-x))
    tl.store(out_ptr + row * I + cols, (silu * up).to(ty), mask=ok)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """Same result as ``silu_and_mul_reference``; output contiguous ``[..., I]``."""
    inter = x.shape[-1] // 2
    out = torch.empty(*x.shape[:-1], inter, dtype=x.dtype, device=x.device)
    rows = x.reshape(-1, x.shape[-1])
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    if rows.shape[0] == 0 or inter == 0:
        return out
    block = min(triton.next_power_of_2(inter), 1024)
    warps = min(max(block // 256, 1), 4)
    silu_and_mul_kernel[(rows.shape[0], triton.cdiv(inter, block))](rows, out, rows.stride(0), inter,
                                                                    BLOCK=block, num_warps=warps)
    return out
