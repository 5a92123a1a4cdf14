"""The one matrix-product helper every deltabench Triton kernel uses.

Triton's CPU interpreter (TRITON_INTERPRET=1, used by the CPU tests) multiplies bf16 operands as their
raw 16-bit integers, so under the interpreter both operands are widened to fp32 first. That is the same
arithmetic a tensor core does for 16-bit operands (exact products, fp32 accumulation), so the CPU tests
check the same function the GPU computes.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

__all__ = ["INTERPRETED", "mma", "mma_acc"]

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
