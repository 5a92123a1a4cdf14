"""SDM at its dense limit through deltabench's GDN Triton kernels.

When every token writes every slot (W = S: the write slots of a token are distinct, so they are all S of them),
every slot decays by ``exp(g_t)`` at every token and SDM's rule is the gated delta rule with K = S::

    M <- exp(g_t) M;   M <- M + beta_t k_t (v_t - k_t^T M)^T;   y_t = q_t^T M

with the dense key ``k_t[k_idx[n]] = k_val[n]``, the dense query ``q_t[s] = sum of q_val[m] with q_idx[m] = s`` (a
read slot may repeat) and no query scale; the bank ``[B, H, S, D]`` is GDN's state ``[B, H, K, V]``. The sparse
kernels of :mod:`.triton_chunk` do pairwise work over a chunk's C*W write entries, which at W = S is C*S entries
where the dense kernels do C*K; this path runs :func:`deltabench.kernels.gdn.triton.chunk.chunk_gated_delta_rule`
instead. Both densifications are deterministic (a scatter of distinct slots, and a one-hot product for the reads),
and so are the GDN kernels (no atomics): the op's bitwise contract holds, and the gate checks it like any run.
Key-weighted decay (a decay per slot) and repeated writes keep the sparse kernels.
"""

from __future__ import annotations

from typing import cast

import torch

from ...gdn.triton.chunk import chunk_gated_delta_rule

__all__ = ["READ_BLOCK_TOKENS", "sdm_dense_gdn", "takes_dense_path"]

READ_BLOCK_TOKENS = 1024  # tokens whose [R, S] one-hot read matrices are built at once (bounds that memory)
_GDN_MAX_K = 256  # the GDN kernels' tile limit on K (= S here) and V (= D)


def takes_dense_path(
    k_val: torch.Tensor,
    q_val: torch.Tensor,
    v: torch.Tensor,
    S: int,
    *,
    key_weighted_decay: bool,
    allow_repeated_writes: bool,
) -> bool:
    """Whether a call is at the dense limit this path serves: W = S, no key-weighted decay, no repeated writes,
    S and D within the GDN kernels' tiles, and one float dtype for k_val, q_val and v (densifying keeps values)."""
    W, D = k_val.shape[-1], v.shape[-1]
    same_dtype = k_val.dtype == q_val.dtype == v.dtype
    plain = not key_weighted_decay and not allow_repeated_writes
    return W == S and plain and S <= _GDN_MAX_K and D <= _GDN_MAX_K and same_dtype


def _dense_reads(q_idx: torch.Tensor, q_val: torch.Tensor, S: int) -> torch.Tensor:
    """``q [B, T, H, S]``: each token's read weights summed per slot, by a one-hot product (deterministic, where a
    scatter-add of repeated slots on a GPU is not), a block of tokens at a time."""
    slots = torch.arange(S, device=q_idx.device)
    blocks = []
    for t0 in range(0, q_idx.shape[1], READ_BLOCK_TOKENS):
        idx = q_idx[:, t0 : t0 + READ_BLOCK_TOKENS]
        val = q_val[:, t0 : t0 + READ_BLOCK_TOKENS].float()
        one_hot = (idx.unsqueeze(-1) == slots).to(torch.float32)  # [B, t, H, R, S]
        blocks.append(torch.einsum("bthr,bthrs->bths", val, one_hot))
    return torch.cat(blocks, dim=1).to(q_val.dtype)


def sdm_dense_gdn(
    k_idx: torch.Tensor,
    k_val: torch.Tensor,
    q_idx: torch.Tensor,
    q_val: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_bank: torch.Tensor | None,
    S: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """SDM with W = S (checked by the caller, :func:`takes_dense_path`) as GDN with K = S: ``(y, final_bank)``,
    y ``[B, T, H, D]`` in v's dtype and the bank ``[B, H, S, D]`` float32; differentiable in every float input."""
    B, T, H, _ = k_idx.shape
    k = k_val.new_zeros(B, T, H, S).scatter(-1, k_idx.long(), k_val)  # distinct slots: one value per slot
    q = _dense_reads(q_idx.long(), q_val, S)
    y, bank = chunk_gated_delta_rule(q, k, v, g, beta, scale=1.0, initial_state=initial_bank, output_final_state=True)
    return y, cast(torch.Tensor, bank)  # output_final_state=True: always a tensor
