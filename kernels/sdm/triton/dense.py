"""SDM at its dense limit through deltabench's GDN Triton kernels.

When every token writes every slot (W = S: the write slots of a token are distinct, so they are all S of them),
every slot decays by ``exp(g_t)`` at every token and SDM's rule is the gated delta rule with K = S::

    M <- exp(g_t) M;   M <- M + beta_t k_t (v_t - k_t^T M)^T;   y_t = q_t^T M

with the dense key ``k_t[k_idx[n]] = k_val[n]``, the dense query ``q_t[s] = sum of q_val[m] with q_idx[m] = s`` (a
read slot may repeat) and no query scale; the bank ``[B, H, S, D]`` is GDN's state ``[B, H, K, V]``. The sparse
kernels of :mod:`.triton_chunk` do pairwise work over a chunk's C*W write entries, which at W = S is C*S entries
where the dense kernels do C*K; this path runs
:func:`deltabench.kernels.gdn.triton.chunk_split.chunk_gated_delta_rule_split` instead (its forward, walk and
outputs apart, measured 2.9x chunk.py's at this limit's shape on the H200: 0.257 against 0.749 ms at
B1-T8192-H2-K128-V128; the same backward). Both densifications are deterministic (a scatter of distinct slots;
for the reads a small Triton kernel summing each slot's weights in a fixed order, with a gather for its
backward), and so are the GDN kernels (no atomics): the op's bitwise contract holds, and the gate checks it like
any run.
Key-weighted decay (a decay per slot) and repeated writes keep the sparse kernels.
"""

from __future__ import annotations

from typing import cast

import torch
import triton
import triton.language as tl

from ...gdn.triton.chunk_split import chunk_gated_delta_rule_split

__all__ = ["sdm_dense_gdn", "takes_dense_path"]

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


@triton.jit
def _dense_reads_kernel(idx, val, out, R: tl.constexpr, S: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_S: tl.constexpr):
    """One program per (token, head) row and block of slots: ``out[s] = sum of val[m] with idx[m] = s``, summed in
    float32 by blocks of m in order and a fixed tree within a block: the same bits every call."""
    row = tl.program_id(0).to(tl.int64)
    s = tl.program_id(1) * BLOCK_S + tl.arange(0, BLOCK_S)
    acc = tl.zeros([BLOCK_S], dtype=tl.float32)
    for m0 in range(0, R, BLOCK_R):
        m = m0 + tl.arange(0, BLOCK_R)
        mask = m < R
        i = tl.load(idx + row * R + m, mask=mask, other=-1)
        w = tl.load(val + row * R + m, mask=mask, other=0.0).to(tl.float32)
        acc += tl.sum(tl.where(i[:, None] == s[None, :], w[:, None], 0.0), axis=0)
    tl.store(out + row * S + s, acc, mask=s < S)


class _DenseReads(torch.autograd.Function):
    """``q [B, T, H, S]`` from the read slots and weights: the weights summed per slot (a read slot may repeat), in
    a Triton kernel with a fixed summation order (a scatter-add on a GPU adds in no fixed order); the backward is
    a gather, ``d q_val[m] = d q[q_idx[m]]``."""

    @staticmethod
    def forward(ctx, q_idx: torch.Tensor, q_val: torch.Tensor, S: int) -> torch.Tensor:  # type: ignore[override]
        R = q_idx.shape[-1]
        idx, val = q_idx.contiguous(), q_val.contiguous()
        out = torch.empty(*q_idx.shape[:-1], S, device=q_val.device, dtype=torch.float32)
        rows = idx.numel() // R
        block_s = min(64, triton.next_power_of_2(S))
        grid = (rows, triton.cdiv(S, block_s))
        _dense_reads_kernel[grid](idx, val, out, R, S, min(32, triton.next_power_of_2(R)), block_s)
        ctx.save_for_backward(idx)
        return out.to(q_val.dtype)

    @staticmethod
    def backward(ctx, dq: torch.Tensor):  # type: ignore[override]
        (idx,) = ctx.saved_tensors
        return None, torch.gather(dq, -1, idx.long()), None


def _dense_reads(q_idx: torch.Tensor, q_val: torch.Tensor, S: int) -> torch.Tensor:
    """``q [B, T, H, S]``: each token's read weights summed per slot (:class:`_DenseReads`)."""
    return _DenseReads.apply(q_idx, q_val, S)


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
    q = _dense_reads(q_idx, q_val, S)
    y, bank = chunk_gated_delta_rule_split(
        q, k, v, g, beta, scale=1.0, initial_state=initial_bank, output_final_state=True
    )
    return y, cast(torch.Tensor, bank)  # output_final_state=True: always a tensor
