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
B1-T8192-H2-K128-V128; the same backward). Both densifications are one deterministic Triton kernel, one
program per (token, head) and O(W + R + S) work where the token's read slots are distinct: each weight is stored
at its slot, and a row whose read slots repeat sums them in a fixed order instead (:func:`_densify_kernel`;
gathers for the backward). The same kernel checks the slots; on a GPU its flag is copied to the host behind the
kernel and read once the GDN kernels are queued, so the host waits on the densify alone, never on the GDN work
(a read back after them left the GPU idle while the next call's kernels were launched); the GDN kernels use no
atomics: the op's bitwise contract holds, and the gate checks it
like any run.
Key-weighted decay (a decay per slot) and repeated writes keep the sparse kernels.
"""

from __future__ import annotations

from collections.abc import Callable
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
    seen_w,
    seen_r,
    bad,
    W: tl.constexpr,
    R: tl.constexpr,
    S: tl.constexpr,
    BLOCK_W: tl.constexpr,
    BLOCK_R: tl.constexpr,
    SUM_R: tl.constexpr,
    SUM_S: tl.constexpr,
):
    """One program per (token, head) row, W = S <= BLOCK_W and R <= BLOCK_R: the row's dense key and query and its
    slot checks, in O(W + R + S) work on the rows that need no sum.

    Writes: each in-range write entry n stores its weight at ``k_out[k_idx[n]]`` and its own n at
    ``seen_w[k_idx[n]]``; after the barrier (the program's global stores visible to all of its threads) each reads
    its slot of ``seen_w`` back. Two entries naming one slot cannot both read back their own n, so a repeated write
    slot shows as a mismatch, and with W = S any slot left unwritten implies a repeat or an out-of-range entry: no
    initialisation and no pairwise compare. Reads: the same trick with ``seen_r`` finds whether the row repeats a
    read slot. If not, each read weight is stored at ``q_out[q_idx[m]]`` in a q_out the caller zero-filled (the
    other slots' sum is 0). If so, the whole row (a uniform branch per program) sums in a fixed order: for each
    block of slots, blocks of m in order and a fixed tree within a block, the same bits every call. Single
    weights go out as ``w + 0.0``, the value a sum of one term gives (-0.0 becomes +0.0), so both branches agree
    with a sum everywhere. The query stays float32: the caller rounds it to the inputs' dtype in torch, whose
    rounding is the same on every device, where Triton's interpreter truncates to bfloat16.

    ``bad`` becomes nonzero on a repeated or out-of-range write slot or an out-of-range read slot (a repeated read
    slot is legitimate). Out-of-range indices are masked off every address, so bad ones cannot fault; they leave
    some of the row's outputs unspecified, and the caller raises."""
    row = tl.program_id(0).to(tl.int64)
    n = tl.arange(0, BLOCK_W)
    n_in = n < W
    i = tl.load(k_idx + row * W + n, mask=n_in, other=-1)
    w_ok = n_in & (i >= 0) & (i < S)
    key = tl.load(k_val + row * W + n, mask=w_ok, other=0.0).to(tl.float32) + 0.0
    tl.store(k_out + row * S + i, key.to(k_out.dtype.element_ty), mask=w_ok)
    tl.store(seen_w + row * S + i, n, mask=w_ok)
    m = tl.arange(0, BLOCK_R)
    m_in = m < R
    j = tl.load(q_idx + row * R + m, mask=m_in, other=-1)
    r_ok = m_in & (j >= 0) & (j < S)
    tl.store(seen_r + row * S + j, m, mask=r_ok)
    # The read-backs below must see every thread's stores above.
    tl.debug_barrier()
    w_back = tl.load(seen_w + row * S + i, mask=w_ok, other=-1)  # -1: an out-of-range entry fails too
    r_back = tl.load(seen_r + row * S + j, mask=r_ok, other=-1)
    wrong = tl.sum((n_in & (w_back != n)).to(tl.int32), axis=0) + tl.sum((m_in & ~r_ok).to(tl.int32), axis=0)
    repeats = tl.sum((r_ok & (r_back != m)).to(tl.int32), axis=0)
    if repeats == 0:
        query = tl.load(q_val + row * R + m, mask=r_ok, other=0.0).to(tl.float32) + 0.0
        tl.store(q_out + row * S + j, query, mask=r_ok)
    else:
        for s0 in range(0, S, SUM_S):
            s = s0 + tl.arange(0, SUM_S)
            query = tl.zeros([SUM_S], dtype=tl.float32)
            for m0 in range(0, R, SUM_R):
                mm = m0 + tl.arange(0, SUM_R)
                mask = mm < R
                jj = tl.load(q_idx + row * R + mm, mask=mask, other=-1)
                ww = tl.load(q_val + row * R + mm, mask=mask, other=0.0).to(tl.float32)
                query += tl.sum(tl.where(jj[:, None] == s[None, :], ww[:, None], 0.0), axis=0)
            tl.store(q_out + row * S + s, query, mask=s < S)
    tl.atomic_max(bad, wrong, mask=wrong > 0)  # only a bad row writes: no contention on good input


class _Densify(torch.autograd.Function):
    """``(k, q, bad)``: the dense key and query ``[B, T, H, S]`` in k_val's dtype and an int32 flag, nonzero when
    a write slot is repeated or out of range or a read slot is out of range (one kernel, :func:`_densify_kernel`,
    for W = S <= 256: stores at the slots where a row's slots are distinct, a fixed-order sum where its read slots
    repeat; a scatter-add on a GPU adds in no fixed order). The backward is two gathers,
    ``d k_val[n] = d k[k_idx[n]]`` and ``d q_val[m] = d q[q_idx[m]]``."""

    @staticmethod
    def forward(ctx, k_idx: torch.Tensor, k_val: torch.Tensor, q_idx: torch.Tensor, q_val: torch.Tensor, S: int):  # type: ignore[override]
        k_idx, q_idx = k_idx.contiguous(), q_idx.contiguous()
        W, R = k_idx.shape[-1], q_idx.shape[-1]
        if W != S or S > _GDN_MAX_K:  # the kernel's write check needs a permutation, its rows one block
            raise ValueError(f"the dense path densifies W = S <= {_GDN_MAX_K} write slots, got W={W}, S={S}")
        k = torch.empty(*k_idx.shape[:-1], S, device=k_val.device, dtype=k_val.dtype)  # exact: one weight a slot
        q = torch.zeros(*k.shape, device=k.device, dtype=torch.float32)  # unread slots stay 0; torch rounds later
        bad = torch.zeros((), device=k_val.device, dtype=torch.int32)
        rows = k_idx.numel() // W if W else 0
        if rows:
            # Scratch for the kernel's distinctness checks: every cell a row reads back it first writes.
            seen = torch.empty(2, rows, S, device=k_val.device, dtype=torch.int32)
            block_w, block_r = triton.next_power_of_2(W), triton.next_power_of_2(max(R, 1))
            sum_r, sum_s = min(32, block_r), min(64, triton.next_power_of_2(S))
            tensors = (k_idx, k_val.contiguous(), q_idx, q_val.contiguous(), k, q, *seen, bad)
            _densify_kernel[(rows,)](*tensors, W, R, S, block_w, block_r, sum_r, sum_s, num_warps=4)
        ctx.save_for_backward(k_idx, q_idx)
        ctx.mark_non_differentiable(bad)
        return k, q.to(q_val.dtype), bad

    @staticmethod
    def backward(ctx, dk: torch.Tensor | None, dq: torch.Tensor | None, _bad: None):  # type: ignore[override]
        k_idx, q_idx = ctx.saved_tensors
        dk_val = None if dk is None else torch.gather(dk, -1, k_idx.long())
        dq_val = None if dq is None else torch.gather(dq, -1, q_idx.long())
        return None, dk_val, None, dq_val, None


def _flag_reader(flag: torch.Tensor) -> Callable[[], int]:
    """A function that returns `flag`'s value, its copy to the host queued now: on a GPU into pinned memory
    behind the work queued so far, so that reading it waits for that work alone and not for what is queued after."""
    if flag.device.type != "cuda":
        return lambda: int(flag.item())
    host = torch.empty(flag.shape, dtype=flag.dtype, pin_memory=True)
    host.copy_(flag, non_blocking=True)
    copied = torch.cuda.Event()
    copied.record()

    def read() -> int:
        copied.synchronize()
        return int(host.item())

    return read


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
    read_bad = _flag_reader(bad)
    y, bank = chunk_gated_delta_rule_split(
        q, k, v, g, beta, scale=1.0, initial_state=initial_bank, output_final_state=True
    )
    # The flag is read once the GDN kernels are queued (the module docstring). Bad indices only made k and q
    # wrong (never an address), and nothing wrong is returned.
    if read_bad():
        check_slots(k_idx, q_idx, S, allow_repeated_writes=False)  # raises the one-line error that applies
        raise RuntimeError("sdm's dense-path slot check flagged indices that check_slots accepts")
    return y, cast(torch.Tensor, bank)  # output_final_state=True: always a tensor
