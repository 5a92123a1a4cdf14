"""Token-serial Gated DeltaNet in PyTorch: inputs in their dtype, the state in float32.

Layout: q, k ``[B, T, H, K]``; v ``[B, T, H, V]``; g, beta ``[B, T, H]``; state ``[B, H, K, V]`` (keys index
rows); g is a log-decay (<= 0) in float32. The readable version beside :mod:`.torch_chunk`; backward is autograd.
"""

from __future__ import annotations

import torch

from ...common import check_op_inputs, default_scale
from ...common.varlen import run_packed

__all__ = ["gdn_torch_recurrent"]


def gdn_torch_recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gated DeltaNet one token at a time, the state kept in float32.

    Per token t, for each (batch, head)::

        S <- exp(g_t) S;  u = beta_t (v_t - S^T k_t);  S <- S + k_t u^T;  o_t = S^T (scale q_t)

    Each token's inputs are cast to float32 for the state math; o_t is cast back to ``v.dtype``.

    Args:
        q, k: ``[B, T, H, K]`` queries and keys (used as given; layers L2-normalise them).
        v: ``[B, T, H, V]`` values.
        g: ``[B, T, H]`` log-decay (<= 0).
        beta: ``[B, T, H]`` write strength.
        scale: query scale, default ``K ** -0.5``.
        initial_state: optional ``[B, H, K, V]`` state before the first token.
        cu_seqlens: int32 ``[N + 1]`` offsets of N sequences packed along T (B = 1); the states are then
            ``[N, H, K, V]`` (kernels/common/varlen.run_packed).

    Returns:
        ``(o, final_state)``: ``o`` ``[B, T, H, V]`` in ``v.dtype``, ``final_state`` ``[B, H, K, V]`` float32.

    Examples::

        >>> from deltabench.references.gdn import make_inputs
        >>> x = make_inputs(2, 100, 4, 64, 64, dtype=torch.bfloat16)
        >>> o, ht = gdn_torch_recurrent(**x)
    """
    if cu_seqlens is not None:
        return run_packed(
            gdn_torch_recurrent, q, k, v, g, beta, cu_seqlens=cu_seqlens, scale=scale, initial_state=initial_state
        )
    B, T, H, K, V = check_op_inputs("gdn", q, k, v, {"g": g, "beta": beta}, initial_state)
    scale = default_scale(scale, K)
    state = v.new_zeros(B, H, K, V, dtype=torch.float32) if initial_state is None else initial_state.float()
    outs = []
    for t in range(T):
        q_t, k_t, v_t = q[:, t].float(), k[:, t].float(), v[:, t].float()
        state = state * g[:, t].float().exp()[..., None, None]
        u = beta[:, t].float()[..., None] * (v_t - torch.einsum("bhk,bhkv->bhv", k_t, state))
        state = state + k_t[..., :, None] * u[..., None, :]
        outs.append(torch.einsum("bhk,bhkv->bhv", q_t * scale, state).to(v.dtype))
    o = torch.stack(outs, dim=1) if outs else v.new_zeros(B, 0, H, V)
    return o, state
