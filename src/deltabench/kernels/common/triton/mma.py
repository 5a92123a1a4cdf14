"""The one matrix-product helper every deltabench Triton kernel uses, with its precision and tile width.

Triton's CPU interpreter (TRITON_INTERPRET=1, used by the CPU tests) multiplies bf16 operands as their
raw 16-bit integers, so under the interpreter both operands are widened to fp32 first. That is the same
arithmetic a tensor core does for 16-bit operands (exact products, fp32 accumulation), so the CPU tests
check the same function the GPU computes.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

__all__ = ["INTERPRETED", "dot_precision", "mma", "mma_acc", "padded"]

INTERPRETED = tl.constexpr(os.environ.get("TRITON_INTERPRET") == "1")


@triton.jit
def mma(a, b, prec: tl.constexpr):
    """``tl.dot(a, b)`` with fp32 accumulation; `prec` ("ieee" or "tf32") applies to fp32 operands."""
    if INTERPRETED:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b, input_precision=prec)


@triton.jit
def mma_acc(a, b, acc, prec: tl.constexpr):
    """``acc + a @ b`` through ``tl.dot``'s accumulator (fp32 `acc`), widened as :func:`mma` under the interpreter."""
    if INTERPRETED:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc, input_precision=prec)


def dot_precision(dtype: torch.dtype) -> str:
    """IEEE products for fp32 inputs (no silent tf32); tf32 for the fp32 operands of a 16-bit run."""
    return "ieee" if dtype == torch.float32 else "tf32"


def padded(n: int) -> int:
    """Tile width for a head dimension: the next power of two, at least 16 (tl.dot's minimum)."""
    return max(16, triton.next_power_of_2(n))
