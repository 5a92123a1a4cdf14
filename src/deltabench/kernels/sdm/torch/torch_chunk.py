"""Chunked Sparse Delta Memory in PyTorch (WY representation over tokens), float32 inside.

Layout: ``k_idx, k_val [B, T, H, W]``; ``q_idx, q_val [B, T, H, R]``; ``v [B, T, H, D]``; ``g, beta [B, T, H]``;
bank ``[B, H, S, D]`` float32.

Derivation. In a chunk starting from bank ``M0``, let ``L_s(t)`` be the log-decay slot s has received from the chunk's
first token up to token t inclusive (the sum of ``g_t'`` over the tokens t' <= t that write s). The recurrence unrolls
to ``M_t[s] = exp(L_s(t)) M0[s] + sum_{t' <= t, n: s_n(t') = s} exp(L_s(t) - L_s(t')) k_val_t'[n] u_t'`` with
``u_t = beta_t (v_t - r_t)``. So, over the chunk's tokens,

    (I + tril(beta A, -1)) U = beta (V - Kdec M0),   Y = Qdec M0 + QK U

where ``A[t, t'] = sum over write pairs (t, n), (t', n') on one slot of k_val k_val' exp(L_s(t) - L_s(t'))`` (writes x
writes, t' < t), ``QK[t, t']`` the same over read (t, m) x write (t', n') pairs with t' <= t, and ``Kdec M0``,
``Qdec M0`` the decay-weighted gathers of the chunk's bank rows. The new row of a written slot is
``exp(L_s(C)) M0[s] + sum over its writes of k_val exp(L_s(C) - L_s(t')) u_t'``; other rows do not change.

Phase 1 (per chunk): write and read entries sorted by (slot, token, write before read), a segmented scan of the
log-decays per slot gives every entry's ``L``, then the Gram matrices A and QK. Phase 2 (chunk after chunk): gather
the bank rows, solve for U, one dual product (Y and the new rows), decay-and-write the touched rows (one value per
row, so a slot hit by many entries is decayed once per token). Backward is autograd, through segments of chunks
that are checkpointed (:func:`segment_chunks`): the memory of ~2 sqrt(N) banks rather than N.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.utils.checkpoint import checkpoint

from ....references.sdm import check_sdm_inputs, first_write_mask

__all__ = ["sdm_torch_chunk", "segment_chunks", "segmented_cumsum"]


def segmented_cumsum(x: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
    """Inclusive cumulative sum of `x` along its last dim, restarted wherever `start` is True (a Hillis-Steele scan:
    each sum adds only terms of its own segment, so its rounding does not grow with the length of the array)."""
    n = x.shape[-1]
    flags = start.clone()
    flags[..., 0] = True
    offset = 1
    while offset < n:
        shifted = torch.nn.functional.pad(x[..., :-offset], (offset, 0))
        shifted_flags = torch.nn.functional.pad(flags[..., :-offset], (offset, 0), value=True)
        x = torch.where(flags, x, x + shifted)
        flags = flags | shifted_flags
        offset *= 2
    return x


def segment_chunks(num_chunks: int) -> int:
    """Chunks per checkpointed segment when a gradient is wanted: ceil(sqrt(N)), which makes the banks kept at
    segment starts and the banks of the one segment being redone about equal in number."""
    return max(1, math.isqrt(max(num_chunks - 1, 0)) + 1)


@contextmanager
def _deterministic() -> Iterator[None]:
    """PyTorch's deterministic algorithms for the body (its scatter-add sums repeated indices in a fixed order on a
    GPU, where the default adds them atomically in whatever order threads arrive); the caller's setting after."""
    before, warn_only = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before, warn_only=warn_only)


class _Gather(torch.autograd.Function):
    """``src.gather(dim, index)`` with a bitwise reproducible backward: gradients of repeated indices (bank rows
    that several entries gather, a slot's decay total that all its entries read) are summed in a fixed order."""

    @staticmethod
    def forward(ctx, src: torch.Tensor, dim: int, index: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.dim, ctx.src_shape = dim, src.shape
        ctx.save_for_backward(index)
        return src.gather(dim, index)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:  # type: ignore[override]
        (index,) = ctx.saved_tensors
        with _deterministic():
            d_src = grad.new_zeros(ctx.src_shape).scatter_add_(ctx.dim, index, grad)
        return d_src, None, None


def _gather(src: torch.Tensor, dim: int, index: torch.Tensor) -> torch.Tensor:
    """``src.gather(dim, index)``, differentiable with the same bits every backward (:class:`_Gather`)."""
    return _Gather.apply(src, dim, index)


def _pad_tokens(x: torch.Tensor, pad: int, value: float = 0.0) -> torch.Tensor:
    """Pad dim 1 (T) of a [B, T, ...] tensor with `pad` tokens of `value`."""
    if pad == 0:
        return x
    return torch.cat([x, x.new_full((x.shape[0], pad, *x.shape[2:]), value)], dim=1)


def _chunk_slot_decays(
    slot_w: torch.Tensor, ld: torch.Tensor, slot_r: torch.Tensor, C: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-slot log-decays of one chunk's entries.

    Args:
        slot_w, ld: ``[B, H, C*W]`` write slots and their log-decays (0 for a slot's repeat within a token).
        slot_r: ``[B, H, C*R]`` read slots.

    Returns:
        ``(L_w, L_r, L_total_w)``: each write's and read's log-decay since the chunk start, inclusive of its own
        token (a read sees the write of its token), and each write slot's total over the chunk.
    """
    E, P = slot_w.shape[-1], slot_r.shape[-1]
    W, R = E // C, P // C
    dev = slot_w.device
    tok = torch.cat([torch.arange(E, device=dev) // W, torch.arange(P, device=dev) // R])
    kind = torch.cat([torch.zeros(E, dtype=torch.long, device=dev), torch.ones(P, dtype=torch.long, device=dev)])
    slots = torch.cat([slot_w, slot_r], dim=-1)
    order = (slots * (2 * C) + 2 * tok + kind).argsort(dim=-1, stable=True)
    sorted_slots = slots.gather(-1, order)
    sorted_ld = torch.cat([ld, ld.new_zeros(*ld.shape[:-1], P)], dim=-1).gather(-1, order)
    start = torch.ones_like(sorted_slots, dtype=torch.bool)
    start[..., 1:] = sorted_slots[..., 1:] != sorted_slots[..., :-1]
    L_sorted = segmented_cumsum(sorted_ld, start)
    # The slot's total: the scan's value at the last entry of its segment.
    seg = start.long().cumsum(-1) - 1
    pos = torch.arange(E + P, device=dev).expand_as(seg)
    last = torch.zeros_like(seg).scatter_reduce(-1, seg, pos, reduce="amax", include_self=False)
    total_sorted = _gather(L_sorted, -1, last.gather(-1, seg))
    L = torch.empty_like(L_sorted).scatter(-1, order, L_sorted)
    total = torch.empty_like(L_sorted).scatter(-1, order, total_sorted)
    return L[..., :E], L[..., E:], total[..., :E]


def _pair_decay(mask: torch.Tensor, L_row: torch.Tensor, L_col: torch.Tensor) -> torch.Tensor:
    """``exp(L_row[i] - L_col[j])`` where `mask`, else 0 (the difference is clamped first so that no overflowing
    exp of a masked-out pair can poison the gradient)."""
    diff = torch.where(mask, L_row[..., :, None] - L_col[..., None, :], torch.zeros((), device=mask.device))
    return diff.exp() * mask


def sdm_torch_chunk(
    k_idx: torch.Tensor,
    k_val: torch.Tensor,
    q_idx: torch.Tensor,
    q_val: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_bank: torch.Tensor | None = None,
    key_weighted_decay: bool = False,
    *,
    num_slots: int | None = None,
    chunk_size: int = 64,
    allow_repeated_writes: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """SDM by chunks of `chunk_size` tokens, any T (a partial last chunk is padded with tokens that neither decay,
    write nor read).

    Computes the same as :func:`deltabench.kernels.sdm.torch.torch_recurrent.sdm_torch_recurrent`; float inputs are used
    in float32, y is cast to ``v.dtype``. Backward is autograd over checkpointed segments of chunks (about
    2 sqrt(N) copies of the bank held for N chunks). Memory per chunk grows as ``(C W)^2``: a reference, not a
    fast kernel.

    Args:
        k_idx, k_val: ``[B, T, H, W]`` write slots (int64, distinct per token) and weights.
        q_idx, q_val: ``[B, T, H, R]`` read slots and weights.
        v: ``[B, T, H, D]``; g: ``[B, T, H]`` log-decay (<= 0); beta: ``[B, T, H]``.
        initial_bank: optional ``[B, H, S, D]`` (zeros otherwise; then ``num_slots`` gives S).
        key_weighted_decay: the decay of write n is ``exp(g_t * k_val[n])``.
        chunk_size: C, default 64.
        allow_repeated_writes: accept a write slot repeated within a token (decayed once) instead of raising.

    Returns:
        ``(y, final_bank)``: ``[B, T, H, D]`` in ``v.dtype`` and ``[B, H, S, D]`` float32.

    Examples::

        >>> from deltabench.references.sdm import make_inputs
        >>> x = make_inputs(1, 200, 2, 256, 32, 8, 8)
        >>> y, bank = sdm_torch_chunk(**x, chunk_size=64)
    """
    B, T, H, S, D, W, R = check_sdm_inputs(
        k_idx,
        k_val,
        q_idx,
        q_val,
        v,
        g,
        beta,
        initial_bank,
        num_slots,
        allow_repeated_writes=allow_repeated_writes,
        key_weighted_decay=key_weighted_decay,
    )
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    C, out_dtype = chunk_size, v.dtype
    N = -(-T // C)
    pad = N * C - T
    first = _pad_tokens(first_write_mask(k_idx), pad, True)
    # Padding tokens write and read distinct slots with weight 0 and decay 0: they change nothing.
    k_idx = torch.cat([k_idx.long(), (torch.arange(W, device=v.device) % S).expand(B, pad, H, W)], dim=1)
    q_idx = torch.cat([q_idx.long(), (torch.arange(R, device=v.device) % S).expand(B, pad, H, R)], dim=1)
    k_val, q_val, v, g, beta = (_pad_tokens(x.float(), pad) for x in (k_val, q_val, v, g, beta))
    log_decay = g[..., None] * k_val if key_weighted_decay else g[..., None].expand_as(k_val)
    log_decay = torch.where(first, log_decay, torch.zeros_like(log_decay))

    def chunk(x: torch.Tensor, i: int) -> torch.Tensor:
        """Chunk i of a [B, T, H, ...] tensor as [B, H, C * last] (entries token-major) or [B, H, C]."""
        x = x[:, i * C : (i + 1) * C].transpose(1, 2)
        return x.reshape(B, H, -1) if x.dim() == 4 else x

    bank = v.new_zeros(B, H, S, D) if initial_bank is None else initial_bank.float()
    dev = v.device
    tok_w, tok_r = torch.arange(C * W, device=dev) // W, torch.arange(C * R, device=dev) // R
    causal_w = tok_w[:, None] > tok_w[None, :]  # writes x writes, strictly earlier
    causal_r = tok_r[:, None] >= tok_w[None, :]  # reads x writes, the read's own token included
    eye = torch.eye(C, device=dev)

    def step(bank: torch.Tensor, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Chunk i from the bank before it: its outputs ``[B, H, C, D]`` and the bank after it."""
        slot_w, kv, ld = chunk(k_idx, i), chunk(k_val, i), chunk(log_decay, i)  # [B, H, C*W]
        slot_r, qv = chunk(q_idx, i), chunk(q_val, i)  # [B, H, C*R]
        v_c, b_c = v[:, i * C : (i + 1) * C].transpose(1, 2), chunk(beta, i)  # [B, H, C, D], [B, H, C]
        # Phase 1: per-slot decays, the Gram matrices A (writes x writes) and QK (reads x writes).
        L_w, L_r, L_tot = _chunk_slot_decays(slot_w, ld, slot_r, C)
        same_w = slot_w[..., :, None] == slot_w[..., None, :]  # [B, H, E, E]
        a_e = kv[..., :, None] * kv[..., None, :] * _pair_decay(same_w & causal_w, L_w, L_w)
        a_kk = a_e.view(B, H, C, W, C, W).sum((3, 5))
        same_r = slot_r[..., :, None] == slot_w[..., None, :]  # [B, H, P, E]
        a_qk = (qv[..., :, None] * kv[..., None, :] * _pair_decay(same_r & causal_r, L_r, L_w)).view(B, H, C, R, C, W)
        a_qk = a_qk.sum((3, 5))
        # Phase 2: gather the chunk's bank rows, solve for U, read, then decay-and-write the touched rows.
        rows_w = _gather(bank, 2, slot_w[..., None].expand(B, H, C * W, D))
        rows_r = _gather(bank, 2, slot_r[..., None].expand(B, H, C * R, D))
        k_m0 = ((kv * L_w.exp())[..., None] * rows_w).view(B, H, C, W, D).sum(3)
        q_m0 = ((qv * L_r.exp())[..., None] * rows_r).view(B, H, C, R, D).sum(3)
        system = eye + b_c[..., None] * a_kk
        u = torch.linalg.solve_triangular(system, b_c[..., None] * (v_c - k_m0), upper=False, unitriangular=True)
        y_c = q_m0 + a_qk @ u
        # Every write entry computes its slot's new row; one representative per slot (its first write entry) is
        # scattered, so each touched row gets exactly one value, decayed once per writing token.
        to_end = kv[..., None, :] * _pair_decay(same_w, L_tot, L_w)  # [B, H, E, E]
        new_rows = L_tot.exp()[..., None] * rows_w + to_end.view(B, H, C * W, C, W).sum(-1) @ u
        rep = same_w.int().argmax(-1) == torch.arange(C * W, device=dev)
        index = slot_w[..., None].expand(B, H, C * W, D)
        touched = bank.new_zeros(B, H, S).scatter(-1, slot_w, 1.0)
        written = torch.zeros_like(bank).scatter_add(2, index, new_rows * rep[..., None])
        bank = bank * (1.0 - touched)[..., None] + written
        return y_c, bank

    def segment(bank: torch.Tensor, c0: int, c1: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Chunks c0..c1-1 in order: their outputs, concatenated over tokens, and the bank after the last."""
        ys = []
        for i in range(c0, c1):
            y_c, bank = step(bank, i)
            ys.append(y_c)
        return torch.cat(ys, dim=2), bank

    # Autograd keeps every chunk's bank (its gathers save their source): N banks at once. With a gradient to
    # come, the chunks run in segments of ~sqrt(N), each checkpointed (its bank in, its work redone backward):
    # ~2 sqrt(N) banks held, for a second forward in the backward.
    wants_grad = torch.is_grad_enabled() and any(x.requires_grad for x in (k_val, q_val, v, g, beta, bank))
    span = segment_chunks(N) if wants_grad else max(N, 1)
    ys = []
    for c0 in range(0, N, span):
        c1 = min(N, c0 + span)
        if span < N:
            y_seg, bank = checkpoint(segment, bank, c0, c1, use_reentrant=False)
        else:
            y_seg, bank = segment(bank, c0, c1)
        ys.append(y_seg)
    y = torch.cat(ys, dim=2)[:, :, :T].transpose(1, 2) if ys else v.new_zeros(B, H, 0, D).transpose(1, 2)
    return y.to(out_dtype), bank
