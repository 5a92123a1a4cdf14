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
B1-T8192-H2-K128-V128; the same backward). Both densifications are one deterministic Triton kernel (each
slot's write weight and summed read weights, in a fixed order; gathers for the backward) that also checks the
slots, so that the call reads the device back once, after the GDN kernels are queued; the GDN kernels use no
atomics: the op's bitwise contract holds, and the gate checks it like any run.
Key-weighted decay (a decay per slot) and repeated writes keep the sparse kernels.
"""

from __future__ import annotations

from typing import cast

import torch
import triton
import triton.language as tl

from ....references.sdm import check_slot_tensors, check_slots
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
def _densify_kernel(
    k_idx,
    k_val,
    q_idx,
    q_val,
    k_out,
    q_out,
    bad,
    W: tl.constexpr,
    R: tl.constexpr,
    S: tl.constexpr,
    BLOCK_W: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    """One program per (token, head) row and block of slots: ``k_out[s]`` the weight of the write entry naming
    slot s, ``q_out[s]`` the float32 sum of the read weights naming it (by blocks of m in order and a fixed tree
    within a block: the same bits every call; rounded to the inputs' dtype by torch, whose rounding is the same on
    every device, where Triton's interpreter truncates to bfloat16), and the slot checks on the way: unless
    every slot of the block is written exactly once (W = S: the write slots are a permutation) and every read
    slot is in ``[0, S)``, ``bad`` becomes nonzero. Indices are only compared, never used as addresses, so bad
    ones cannot fault."""
    row = tl.program_id(0).to(tl.int64)
    s = tl.program_id(1) * BLOCK_S + tl.arange(0, BLOCK_S)
    in_bank = s < S
    key = tl.zeros([BLOCK_S], dtype=tl.float32)
    writes = tl.zeros([BLOCK_S], dtype=tl.int32)
    for n0 in range(0, W, BLOCK_W):
        n = n0 + tl.arange(0, BLOCK_W)
        mask = n < W
        i = tl.load(k_idx + row * W + n, mask=mask, other=-1)
        w = tl.load(k_val + row * W + n, mask=mask, other=0.0).to(tl.float32)
        hit = i[:, None] == s[None, :]
        key += tl.sum(tl.where(hit, w[:, None], 0.0), axis=0)
        writes += tl.sum(hit.to(tl.int32), axis=0)
    query = tl.zeros([BLOCK_S], dtype=tl.float32)
    outside = tl.zeros([BLOCK_R], dtype=tl.int32)
    for m0 in range(0, R, BLOCK_R):
        m = m0 + tl.arange(0, BLOCK_R)
        mask = m < R
        i = tl.load(q_idx + row * R + m, mask=mask, other=-1)
        w = tl.load(q_val + row * R + m, mask=mask, other=0.0).to(tl.float32)
        query += tl.sum(tl.where(i[:, None] == s[None, :], w[:, None], 0.0), axis=0)
        outside += (mask & ((i < 0) | (i >= S))).to(tl.int32)
    tl.store(k_out + row * S + s, key.to(k_out.dtype.element_ty), mask=in_bank)
    tl.store(q_out + row * S + s, query, mask=in_bank)
    wrong = tl.sum((in_bank & (writes != 1)).to(tl.int32), axis=0) + tl.sum(outside, axis=0)
    tl.atomic_max(bad, wrong, mask=wrong > 0)  # only a bad row writes: no contention on good input


class _Densify(torch.autograd.Function):
    """``(k, q, bad)``: the dense key and query ``[B, T, H, S]`` in k_val's dtype and an int32 flag, nonzero when
    a write slot is repeated or out of range or a read slot is out of range (one kernel, :func:`_densify_kernel`;
    a scatter-add on a GPU adds in no fixed order). The backward is two gathers, ``d k_val[n] = d k[k_idx[n]]``
    and ``d q_val[m] = d q[q_idx[m]]``."""

    @staticmethod
    def forward(ctx, k_idx: torch.Tensor, k_val: torch.Tensor, q_idx: torch.Tensor, q_val: torch.Tensor, S: int):  # type: ignore[override]
        k_idx, q_idx = k_idx.contiguous(), q_idx.contiguous()
        W, R = k_idx.shape[-1], q_idx.shape[-1]
        k = torch.empty(*k_idx.shape[:-1], S, device=k_val.device, dtype=k_val.dtype)  # exact: one weight a slot
        q = torch.empty(*k.shape, device=k.device, dtype=torch.float32)  # sums: rounded to q_val's dtype by torch
        bad = torch.zeros((), device=k_val.device, dtype=torch.int32)
        rows = k_idx.numel() // W
        if rows:
            block_s = min(64, triton.next_power_of_2(S))
            grid = (rows, triton.cdiv(S, block_s))
            block_w, block_r = min(32, triton.next_power_of_2(W)), min(32, triton.next_power_of_2(R))
            _densify_kernel[grid](
                k_idx, k_val.contiguous(), q_idx, q_val.contiguous(), k, q, bad, W, R, S, block_w, block_r, block_s
            )
        ctx.save_for_backward(k_idx, q_idx)
        ctx.mark_non_differentiable(bad)
        return k, q.to(q_val.dtype), bad

    @staticmethod
    def backward(ctx, dk: torch.Tensor | None, dq: torch.Tensor | None, _bad: None):  # type: ignore[override]
        k_idx, q_idx = ctx.saved_tensors
        dk_val = None if dk is None else torch.gather(dk, -1, k_idx.long())
        dq_val = None if dq is None else torch.gather(dq, -1, q_idx.long())
        return None, dk_val, None, dq_val, None


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
    """SDM with W = S (checked by the caller, :func:`takes_dense_path`, with the shapes) as GDN with K = S:
    ``(y, final_bank)``, y ``[B, T, H, D]`` in v's dtype and the bank ``[B, H, S, D]`` float32; differentiable in
    every float input. The slot checks run on the device with the densification (one kernel, one read back):
    a repeated or out-of-range write slot or an out-of-range read slot raises :func:`check_slots`' ValueError."""
    check_slot_tensors(k_idx, q_idx, S)
    k, q, bad = _Densify.apply(k_idx, k_val, q_idx, q_val, S)
    y, bank = chunk_gated_delta_rule_split(
        q, k, v, g, beta, scale=1.0, initial_state=initial_bank, output_final_state=True
    )
    # The flag is read once the GDN kernels are queued: its one synchronisation then waits on the work, not
    # ahead of it. Bad indices only made k and q wrong (never an address), and nothing wrong is returned.
    if bad.item():
        check_slots(k_idx, q_idx, S, allow_repeated_writes=False)  # raises the one-line error that applies
        raise RuntimeError("sdm's dense-path slot check flagged indices that check_slots accepts")
    return y, cast(torch.Tensor, bank)  # output_final_state=True: always a tensor
