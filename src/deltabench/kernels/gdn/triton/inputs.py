"""The checks and conversions every chunked GDN entry point applies to its inputs first (chunk.py, chunk_split.py,
auto.py and varlen.py alike)."""

from __future__ import annotations

import torch

__all__ = ["prepare_chunk_inputs"]


def prepare_chunk_inputs(
    name: str,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None,
    initial_state: torch.Tensor | None,
) -> tuple[float, tuple[torch.Tensor, ...], torch.Tensor | None, bool]:
    """What every chunked entry point does first: ``(scale, (q, k, v, g, beta), initial_state, needs_grad)``.

    The default scale K^-0.5; K and V checked against the kernels' 256 limit (`name` says who refused);
    contiguous inputs with g and the initial state in fp32, as the kernels read them; and whether autograd
    needs the backward (a grad-enabled call with any input that requires it).
    """
    K, V = q.shape[-1], v.shape[-1]
    if max(K, V) > 256:
        raise ValueError(f"{name} supports K and V up to 256, got K={K}, V={V}")
    tensors = (q.contiguous(), k.contiguous(), v.contiguous(), g.float().contiguous(), beta.contiguous())
    if initial_state is not None:
        initial_state = initial_state.float().contiguous()
    needs_grad = torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in (*tensors, initial_state))
    return (K**-0.5 if scale is None else scale), tensors, initial_state, needs_grad
