"""A planted gradient error for the gate's tests: identity forward, the backward scaled by a factor."""

from __future__ import annotations

from typing import Any

import torch


class ScaleGrad(torch.autograd.Function):
    """Identity forward; the backward scales the gradient by ``factor`` (``ScaleGrad.apply(x, factor)``)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, factor: float) -> torch.Tensor:
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad * ctx.factor, None
