"""Float64 oracles for Sparse Delta Memory (SDM 2.0.0's recurrence) and its product-key top-k, the op's contract
and its seeded input generators.

Layout: per batch row and head a bank ``M [S, D]`` (S slots, D the head dim); write slots ``k_idx [B, T, H, W]``
(int64) with weights ``k_val [B, T, H, W]``; read slots ``q_idx [B, T, H, R]`` with weights ``q_val``; values
``v [B, T, H, D]``; log-decay ``g [B, T, H]`` (<= 0) and strength ``beta [B, T, H]``; bank ``[B, H, S, D]``.
Per token t, for each (b, h)::

    M[s]   <- exp(g_t) * M[s]                          for s in set(k_idx_t)   (a repeated slot decays once)
    r_t     = sum_n k_val[n] * M[k_idx[n]]
    M[s_n] <- M[s_n] + k_val[n] * beta_t * (v_t - r_t)
    y_t     = sum_m q_val[m] * M[q_idx[m]]

With ``key_weighted_decay`` the decay of write n is ``exp(g_t * k_val[n])`` (a repeated slot takes the decay of its
first entry, as SDM 2.0.0 does), and every k_val must be >= 0, so that it decays. The W write slots of a token
must be distinct: a repeat is a ``ValueError`` unless ``allow_repeated_writes=True``, which gives SDM 2.0.0's
answer for it (decay once, every entry reads and writes).

Product-key top-k (``pk_topk``) is an op of its own: F factors of widths ``n_0..n_{F-1}`` (product S) side by side
in ``raw [..., sum(n_f)]``; slot ``(..(c_0 n_1 + c_1)..) n_{F-1} + c_{F-1}`` scores the float32 sum of its factor
values added in factor order; the selection follows SDM 2.0.0's staged rule (see :func:`pk_topk`).

Nothing here imports the rest of deltabench.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import torch

from . import _inputs as _in
from .contract import ArgSpec, OpContract, decode_work, fwd_bwd_work, io_bytes

__all__ = [
    "CONTRACT",
    "PK_TOPK_CONTRACT",
    "SDM_REGIMES",
    "RowOpContract",
    "check_factors",
    "check_sdm_inputs",
    "check_sdm_shapes",
    "check_slot_tensors",
    "check_slots",
    "first_write_mask",
    "make_inputs",
    "pk_topk",
    "sdm_recurrent",
]

SDM_REGIMES = ("typical", "collisions", "long", "key_weighted", "strong")


@dataclasses.dataclass(frozen=True)
class RowOpContract:
    """The contract of a row-wise function (pk_topk: no sequence, no state), for docs: named dims, inputs in
    argument order, outputs, options and the rule. The harness runs sequence ops (:class:`OpContract`) only."""

    name: str
    title: str
    dims: tuple[str, ...]
    inputs: tuple[ArgSpec, ...]
    outputs: tuple[ArgSpec, ...]
    options: tuple[str, ...]
    rule: str


PK_TOPK_CONTRACT = RowOpContract(
    name="pk_topk",
    title="Product-key top-k",
    dims=("N", "F", "S", "K"),
    inputs=(ArgSpec("raw", ("N", "sum n_f")),),  # the F factors' n_f scores side by side
    outputs=(ArgSpec("val", "NK"), ArgSpec("idx", "NK", "index", differentiable=False)),
    options=("factors", "k"),
    rule="exact top-k of the S = prod(n_f) factor sums, SDM 2.0.0's staged tie rule, indices ascending",
)


# ----------------------------------------------------------------------------------------------------------------
# Argument checks (shared by every implementation: one wording of each error)
# ----------------------------------------------------------------------------------------------------------------


def check_slot_tensors(k_idx: torch.Tensor, q_idx: torch.Tensor, num_slots: int) -> None:
    """The checks of :func:`check_slots` that need no index value, none of them a device read: a one-line
    ValueError when an index tensor is not an integer tensor or W or R exceeds S."""
    for name, idx in (("k_idx", k_idx), ("q_idx", q_idx)):
        if idx.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"{name} must be an int64 (or int32) tensor, got {idx.dtype}")
        if idx.shape[-1] > num_slots:
            raise ValueError(f"{name} selects {idx.shape[-1]} slots per token, more than the bank's S={num_slots}")


def check_slots(
    k_idx: torch.Tensor,
    q_idx: torch.Tensor,
    num_slots: int,
    *,
    allow_repeated_writes: bool,
    decay_weights: torch.Tensor | None = None,
) -> None:
    """Raise a one-line ValueError when a slot index is outside ``[0, num_slots)``, an index tensor is not an
    integer tensor, W or R exceeds S, (unless allowed) a token repeats a write slot, or one of `decay_weights` (the
    write weights under key-weighted decay, which the contract holds to ``k_val >= 0``) is negative."""
    check_slot_tensors(k_idx, q_idx, num_slots)
    # Every condition as a device flag, read back in one transfer: on a GPU each read is a synchronisation that
    # leaves the device idle while the host queues the kernels after it.
    flags = [
        (idx < 0).any() | (idx >= num_slots).any() if idx.numel() else torch.zeros((), dtype=torch.bool)
        for idx in (k_idx, q_idx)
    ]
    check_repeats = not allow_repeated_writes and k_idx.numel() and k_idx.shape[-1] > 1
    if check_repeats:
        ordered = k_idx.sort(dim=-1).values
        same = ordered[..., 1:] == ordered[..., :-1]
        flags.append(same.any())
    if decay_weights is not None:
        flags.append((decay_weights < 0).any())
    bad = torch.stack([f.to(k_idx.device) for f in flags]).tolist()
    for name, idx, out_of_range in (("k_idx", k_idx, bad[0]), ("q_idx", q_idx, bad[1])):
        if out_of_range:
            lo, hi = int(idx.min()), int(idx.max())
            bad_slot = lo if lo < 0 else hi
            where = tuple(int(i) for i in (idx == bad_slot).nonzero()[0])
            raise ValueError(f"{name} holds slot {bad_slot} outside [0, {num_slots}) at index {where}")
    if check_repeats and bad[2]:
        first = tuple(int(i) for i in same.nonzero()[0])
        where, slot = first[:-1], int(ordered[first])
        raise ValueError(f"k_idx repeats write slot {slot} within one token at (b, t, h) = {where}")
    if decay_weights is not None and bad[-1]:
        where = tuple(int(i) for i in (decay_weights < 0).nonzero()[0])
        raise ValueError(
            f"key_weighted_decay needs k_val >= 0 (a write decays its slot by exp(g * k_val)): k_val at {where} is "
            f"{float(decay_weights[where]):.3g}"
        )


def check_factors(factors: Sequence[int], num_slots: int | None = None) -> tuple[int, ...]:
    """The product-key factor widths as a tuple, or a one-line ValueError (no factor, a width < 1, or a product
    that is not the bank's S)."""
    dims = tuple(int(f) for f in factors)
    if not dims or min(dims) < 1:
        raise ValueError(f"product-key factors must be one or more positive widths, got {list(dims)}")
    if num_slots is not None and math.prod(dims) != num_slots:
        raise ValueError(f"product-key factors {list(dims)} address {math.prod(dims)} slots, not S={num_slots}")
    return dims


def check_sdm_shapes(
    k_idx: torch.Tensor,
    k_val: torch.Tensor,
    q_idx: torch.Tensor,
    q_val: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_bank: torch.Tensor | None,
    num_slots: int | None,
) -> tuple[int, int, int, int, int, int, int]:
    """The shape half of :func:`check_sdm_inputs` (no index value read): ``(B, T, H, S, D, W, R)`` or a one-line
    ValueError naming the tensor whose shape breaks the contract."""
    if v.dim() != 4:
        raise ValueError(f"v must be [B, T, H, D], got shape {tuple(v.shape)}")
    B, T, H, D = v.shape
    if k_idx.dim() != 4 or q_idx.dim() != 4:
        raise ValueError(f"k_idx and q_idx must be [B, T, H, W|R], got {tuple(k_idx.shape)} and {tuple(q_idx.shape)}")
    W, R = k_idx.shape[-1], q_idx.shape[-1]
    if initial_bank is not None:
        if initial_bank.dim() != 4:
            raise ValueError(f"initial_bank must be [B, H, S, D], got shape {tuple(initial_bank.shape)}")
        S = initial_bank.shape[2]
        if num_slots is not None and num_slots != S:
            raise ValueError(f"num_slots={num_slots} does not match initial_bank's S={S}")
    elif num_slots is None:
        raise ValueError("the bank size is unknown: pass num_slots or initial_bank")
    else:
        S = int(num_slots)
    dims = {"B": B, "T": T, "H": H, "S": S, "D": D, "W": W, "R": R}
    expected = {"k_idx": (k_idx, "BTHW"), "k_val": (k_val, "BTHW"), "q_idx": (q_idx, "BTHR"), "q_val": (q_val, "BTHR")}
    expected.update({"g": (g, "BTH"), "beta": (beta, "BTH")})
    if initial_bank is not None:
        expected["initial_bank"] = (initial_bank, "BHSD")
    for name, (x, layout) in expected.items():
        want = tuple(dims[c] for c in layout)
        if tuple(x.shape) != want:
            raise ValueError(f"{name} must be [{', '.join(layout)}] = {want}, got {tuple(x.shape)}")
    return B, T, H, S, D, W, R


def check_sdm_inputs(
    k_idx: torch.Tensor,
    k_val: torch.Tensor,
    q_idx: torch.Tensor,
    q_val: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_bank: torch.Tensor | None = None,
    num_slots: int | None = None,
    *,
    allow_repeated_writes: bool = False,
    key_weighted_decay: bool = False,
) -> tuple[int, int, int, int, int, int, int]:
    """Check an sdm call against the contract and return ``(B, T, H, S, D, W, R)``; one-line ValueError otherwise
    (a shape, an index out of range, W or R > S, a repeated write slot, a negative write weight under
    `key_weighted_decay`)."""
    dims = check_sdm_shapes(k_idx, k_val, q_idx, q_val, v, g, beta, initial_bank, num_slots)
    # SDM 2.0.0's key-weighted decay is a forget gate, exp(g * k_val) <= 1, for its default (softmax) write
    # weights; a negative weight grows its slot instead, and signed weights grow the bank without bound (2e7 to
    # 2e21 over 8192 tokens: benchmarks/cpu/sdm_key_weighted_growth.py), so the contract keeps it to k_val >= 0.
    weights = k_val if key_weighted_decay else None
    check_slots(k_idx, q_idx, dims[3], allow_repeated_writes=allow_repeated_writes, decay_weights=weights)
    return dims


def first_write_mask(k_idx: torch.Tensor) -> torch.Tensor:
    """True for each write entry whose slot does not appear earlier among its token's W entries (the entry whose
    decay the slot takes; every entry of a token with distinct slots)."""
    W = k_idx.shape[-1]
    same = k_idx[..., :, None] == k_idx[..., None, :]  # [..., W, W]
    earlier = torch.ones(W, W, dtype=torch.bool, device=k_idx.device).tril(-1)
    return ~(same & earlier).any(-1)


# ----------------------------------------------------------------------------------------------------------------
# The sdm oracle
# ----------------------------------------------------------------------------------------------------------------


def sdm_recurrent(
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
    allow_repeated_writes: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run SDM one token at a time in float64 (the rule in the module docstring).

    Args:
        k_idx, k_val: ``[B, T, H, W]`` write slots (int64) and weights.
        q_idx, q_val: ``[B, T, H, R]`` read slots (int64) and weights.
        v: ``[B, T, H, D]`` values.
        g: ``[B, T, H]`` log-decay (<= 0); beta: ``[B, T, H]`` write strength.
        initial_bank: optional ``[B, H, S, D]`` bank before the first token (zeros otherwise).
        key_weighted_decay: the decay of write n is ``exp(g_t * k_val[n])``.
        num_slots: S, needed when there is no initial bank.
        allow_repeated_writes: accept a write slot repeated within a token (decayed once) instead of raising.

    Returns:
        ``(y, final_bank)``: ``[B, T, H, D]`` and ``[B, H, S, D]``, both float64 (the final bank a new tensor).

    Time and memory, autograd's included, follow the slots the sequence touches (``T (W + R)`` rows per batch row
    and head) plus one gather from and one copy of the bank, not ``T`` passes over it: the gate runs this at
    ``S = 65536, D = 1024``.

    Raises:
        ValueError: a shape breaks the contract, an index is out of range, W or R > S, a write slot repeats, or a
            write weight is negative under ``key_weighted_decay``.
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
    k_val, q_val, v, g, beta = (x.to(torch.float64) for x in (k_val, q_val, v, g, beta))
    k_idx, q_idx = k_idx.long(), q_idx.long()
    first = first_write_mask(k_idx)
    # A dense step (decay, then scatter into [B, H, S, D]) copies the whole bank twice per token, and autograd keeps
    # both copies: 2 T banks. Here the bank is a table of rows, one per slot the sequence touches (a (b, h, s) triple,
    # key b*H*S + h*S + s): a token stacks its W write rows and R read rows out of the table and puts its new write
    # rows back, so time and autograd's memory follow the rows touched, T (W + R) per (b, h). On those rows the
    # arithmetic is the dense step's, operation for operation, on [B, H, W|R, D] tensors laid out as its gathers are.
    offset = (torch.arange(B * H, device=v.device) * S).view(B, 1, H, 1)
    keys = torch.cat([(k_idx + offset).flatten(), (q_idx + offset).flatten()])
    touched, row_of = torch.unique(keys, return_inverse=True)  # touched[row_of[i]] == keys[i]
    k_row, q_row = row_of.split([k_idx.numel(), q_idx.numel()])
    # Per token, the table row of each entry in [B, H, W|R] order, and which write entries are their slot's first.
    k_row = k_row.view(B, T, H, W).transpose(0, 1).reshape(T, B * H * W).tolist()
    q_row = q_row.view(B, T, H, R).transpose(0, 1).reshape(T, B * H * R).tolist()
    is_first = first.transpose(0, 1).reshape(T, B * H * W).tolist()
    if initial_bank is None:
        start = v.new_zeros(B * H * S, D)
    else:
        start = initial_bank.to(torch.float64).reshape(B * H * S, D)
    table = list(start[touched].unbind(0))
    # p[..., n]: the token's first entry with entry n's slot. A slot's row decays once, with that entry's log-decay,
    # and every entry of the slot reads the decayed row and adds into it in entry order (the dense scatter's order).
    same = k_idx[..., :, None] == k_idx[..., None, :]  # [B, T, H, W, W]
    p = torch.where(same, torch.arange(W, device=v.device), W).amin(-1) if W else k_idx  # (amin refuses W = 0)

    def stacked(rows: list[int], n: int) -> torch.Tensor:
        """The table's `rows` as a [B, H, n, D] tensor (n = W or R, either may be 0)."""
        return torch.stack([table[i] for i in rows]).view(B, H, n, D) if rows else v.new_zeros(B, H, n, D)

    ys = []
    for t in range(T):
        kv, qv = k_val[:, t], q_val[:, t]  # [B, H, W|R]
        pt = p[:, t, :, :, None].expand(B, H, W, D)
        log_decay = g[:, t, :, None] * kv if key_weighted_decay else g[:, t, :, None].expand(B, H, W)
        # Each slot of the token's write set decays once: later repeats of a slot add no log-decay.
        log_decay = torch.where(first[:, t], log_decay, torch.zeros_like(log_decay))
        old = stacked(k_row[t], W)
        decayed = old * log_decay.gather(-1, p[:, t]).exp()[..., None]
        # A repeated entry reads its slot's decayed row; with distinct slots that is its own (the gather, which
        # autograd would keep with its input, is skipped).
        rows = decayed if all(is_first[t]) else decayed.gather(2, pt)
        u = beta[:, t, :, None] * (v[:, t] - (kv[..., None] * rows).sum(2))  # [B, H, D]
        new = rows.scatter_add(2, pt, kv[..., None] * u[:, :, None, :])  # every entry adds at its slot's first
        for i, row, f in zip(k_row[t], new.view(B * H * W, D).unbind(0), is_first[t], strict=True):
            if f:  # a repeated entry's position holds its stale read: its slot's new row is at the first entry
                table[i] = row
        read = stacked(q_row[t], R)
        ys.append((qv[..., None] * read).sum(2))
    y = torch.stack(ys, dim=1) if ys else v.new_zeros(B, 0, H, D)
    # Rows of slots no token touched keep their initial values (the dense step multiplies them by exp(0) = 1).
    final = start.index_put((touched,), torch.stack(table)) if table else start.clone()
    return y, final.view(B, H, S, D)


# ----------------------------------------------------------------------------------------------------------------
# The pk_topk oracle
# ----------------------------------------------------------------------------------------------------------------


def _order_key(x: float) -> tuple[float, float]:
    """How SDM 2.0.0 compares scores: as float32 numbers with -0 below +0 and NaN counted as -inf."""
    if math.isnan(x):
        return (-math.inf, -1.0)
    return (x, math.copysign(1.0, x))


def _f32(x: float) -> float:
    return float(torch.tensor(x, dtype=torch.float64).to(torch.float32))


def _round_to(x: float, dtype: torch.dtype) -> float:
    return float(torch.tensor(x, dtype=torch.float32).to(dtype).to(torch.float32))


def _rank_factor(values: list[float]) -> list[int]:
    """Columns of one factor from best to worst: by value, the larger column first on ties."""
    return sorted(range(len(values)), key=lambda c: (_order_key(values[c]), c), reverse=True)


def _select_row(row: list[float], factors: tuple[int, ...], k: int, dtype: torch.dtype) -> list[tuple[int, float]]:
    """SDM 2.0.0's staged selection for one row: ``[(slot, score)]`` in selection order."""
    starts = [sum(factors[:f]) for f in range(len(factors))]
    cols = [row[s : s + n] for s, n in zip(starts, factors, strict=True)]
    ranks = [_rank_factor(c) for c in cols]
    # Stage 0: the first factor's best min(k, n_0) columns, in rank order. An entry is (slot, score).
    prev = [(c, cols[0][c]) for c in ranks[0][: min(k, factors[0])]]
    for f in range(1, len(factors)):
        n, m = len(prev), min(k, factors[f])
        keep = min(k, n * m)
        pairs = []
        for i in range(n):  # brute force over every (rank i of the stage so far, rank j of factor f) pair
            for j in range(m):
                if (i + 1) * (j + 1) > keep:
                    continue
                col = ranks[f][j]
                score = _f32(prev[i][1] + cols[f][col])  # one float32 addition: exact sum rounded once
                if f < len(factors) - 1 and dtype == torch.bfloat16:
                    score = _round_to(score, torch.bfloat16)  # SDM rounds bf16 partial sums before the next factor
                pairs.append((_order_key(score), i + j, i, prev[i][0] * factors[f] + col, score))
        pairs.sort(key=lambda p: (p[0], p[1], p[2]), reverse=True)  # exact ties: larger i + j, then larger i
        prev = [(p[3], p[4]) for p in pairs[:keep]]
    return prev


def pk_topk(
    raw: torch.Tensor, factors: Sequence[int], k: int, *, num_slots: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Product-key top-k, SDM 2.0.0's rule, computed row by row in Python (the oracle).

    Slot ``(c_0, .., c_{F-1})`` has index ``(..(c_0 n_1 + c_1)..) n_{F-1} + c_{F-1}`` and scores the float32 sum of
    ``raw[.., start_f + c_f]`` added in factor order (bf16 input with F > 2: each partial sum rounded to bf16).
    Scores compare as float32 with ``-0 < +0`` and NaN as -inf. Each factor is ranked by value, the larger column
    first on ties; the first factor keeps its best ``min(k, n_0)`` ranks; stage f keeps the best
    ``c = min(k, n m)`` pairs (i, j) of a rank i < n of the stage before and a rank j < m = min(k, n_f) of factor f
    with ``(i + 1)(j + 1) <= c``, exact ties to the larger ``i + j``, then the larger i (an exact top-k: each pair
    left out has c pairs of lower or equal ranks scoring at least as much).

    Args:
        raw: ``[..., sum(factors)]`` float32 or bfloat16 factor scores side by side.
        factors: the widths ``n_0..n_{F-1}``.
        k: how many slots to select (``kk = min(k, prod(factors))`` are returned).
        num_slots: the bank's S, if known: a one-line ValueError unless the widths multiply to it.

    Returns:
        ``(val, idx)``, each ``[..., kk]``: idx int64 strictly ascending; val float64 holding each selected slot's
        float32 score rounded to ``raw.dtype``, differentiable to ``raw`` (gradient 1 to each factor's column).
    """
    dims = check_factors(factors, num_slots)
    if raw.shape[-1] != sum(dims):
        raise ValueError(f"raw's last dim {raw.shape[-1]} is not the sum of the factor widths {list(dims)}")
    if k < 1:
        raise ValueError(f"k must be positive, got {k}")
    kk = min(k, math.prod(dims))
    lead = raw.shape[:-1]
    rows = raw.detach().reshape(-1, raw.shape[-1]).to(torch.float32).tolist()
    idx = torch.zeros(len(rows), kk, dtype=torch.int64)
    score = torch.zeros(len(rows), kk, dtype=torch.float64)
    for r, row in enumerate(rows):
        chosen = sorted(_select_row(row, dims, k, raw.dtype))
        idx[r] = torch.tensor([s for s, _ in chosen], dtype=torch.int64)
        score[r] = torch.tensor([_round_to(x, raw.dtype) for _, x in chosen], dtype=torch.float64)
    idx = idx.reshape(*lead, kk).to(raw.device)
    score = score.reshape(*lead, kk).to(raw.device)
    # The value is the score (its sign bit kept: -0 stays -0); its gradient is that of the selected columns' sum.
    exact = sum(raw.to(torch.float64).gather(-1, c) for c in _slot_columns(idx, dims))
    return _ValueWithGradOf.apply(score, exact), idx


class _ValueWithGradOf(torch.autograd.Function):
    """Forward returns `value`; backward sends the gradient to `proxy` (a differentiable stand-in of the value)."""

    @staticmethod
    def forward(ctx, value: torch.Tensor, proxy: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return value.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[None, torch.Tensor]:  # type: ignore[override]
        return None, grad


def _slot_columns(idx: torch.Tensor, factors: tuple[int, ...]) -> list[torch.Tensor]:
    """Each factor's column (offset into raw) of every slot in `idx`."""
    cols, rest, start = [], idx, sum(factors)
    for n in reversed(factors):
        start -= n
        cols.append(rest % n + start)
        rest = rest // n
    return cols[::-1]


# ----------------------------------------------------------------------------------------------------------------
# Inputs
# ----------------------------------------------------------------------------------------------------------------


# A pool at least this many times the width is drawn by rejection (:func:`_distinct_slots`).
_SPARSE_POOL_RATIO = 32


def _distinct_slots(gen: torch.Generator, shape: tuple[int, ...], pool: int, width: int) -> torch.Tensor:
    """``[*shape, width]`` slots drawn without repeats from ``[0, pool)`` for each position, uniformly (every
    ordered choice of `width` distinct slots equally likely).

    A narrow pool ranks `pool` uniform keys per position. A wide one (at least :data:`_SPARSE_POOL_RATIO` times
    `width`, e.g. the flagship's 64 of 65536) would make that a sort of S keys per token and head, which at
    T = 8192 took most of a GPU job's gate on the host; there each position draws a few more slots than it needs
    and keeps the first `width` distinct ones in drawn order (sampling without replacement by rejection, so as
    uniform as the ranking), redrawing the rare positions left short."""
    if pool < _SPARSE_POOL_RATIO * width or width == 0 or math.prod(shape) == 0:
        keys = torch.rand(*shape, pool, generator=gen)
        return keys.argsort(dim=-1)[..., :width].contiguous()
    # Remembered (references/_inputs.py): the same seed's slots serve three regimes and both initial-state variants.
    return _in.remembered(gen, ("slots", shape, pool, width), lambda: _rejection_slots(gen, shape, pool, width))


def _rejection_slots(gen: torch.Generator, shape: tuple[int, ...], pool: int, width: int) -> torch.Tensor:
    """:func:`_distinct_slots` from a wide pool: the first `width` distinct of a few more uniform draws."""
    extra = width // 4 + 8  # repeats among width + extra draws from >= 32 * width slots are rare
    draws = width + extra
    out = torch.empty(*shape, width, dtype=torch.int64)
    flat = out.view(-1, width)
    todo = torch.arange(flat.shape[0])
    while todo.numel():
        cand = torch.randint(pool, (todo.numel(), draws), generator=gen)
        srt, order = cand.sort(dim=-1, stable=True)
        repeat = torch.zeros_like(cand, dtype=torch.bool)
        repeat[:, 1:] = srt[:, 1:] == srt[:, :-1]  # a later draw of a slot already drawn (stable: in drawn order)
        repeat = torch.empty_like(repeat).scatter(-1, order, repeat)
        # The first `width` positions not repeating, in drawn order: rank positions, repeats pushed past the end.
        rank = torch.arange(draws).expand_as(cand) + draws * repeat
        keep = rank.topk(width, dim=-1, largest=False, sorted=True).values
        full = repeat.sum(-1) <= extra
        picked = cand.gather(-1, keep % draws)  # rows left short are redrawn: their picks are dropped
        flat[todo[full]] = picked[full]
        todo = todo[~full]
    return out


def make_inputs(
    B: int,
    T: int,
    H: int,
    S: int,
    D: int,
    W: int,
    R: int,
    *,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    seed: int = 0,
    regime: str = "typical",
    initial_bank: bool = False,
) -> dict[str, torch.Tensor | int | bool]:
    """Seeded sdm inputs of one regime, ready for ``fn(**inputs)``.

    Regimes: ``typical`` (W distinct slots per token drawn uniformly from S, logsigmoid gates); ``collisions``
    (every token draws its slots from the same ``min(S, W + W // 2 + 1)`` slots, so each slot is hit by most tokens
    of a chunk); ``long`` (uniform slots, gates in ``[-0.05, 0]``); ``key_weighted`` (typical, non-negative write
    weights and ``key_weighted_decay=True``); ``strong`` (the collisions regime's slots with gdn's strong gates:
    even heads ``g ~ U[-5, -0.5]`` per token, odd heads ``U[-1e-3, 0]``, so a slot written by most tokens of a
    64-token chunk sums a log-decay near -120 there, past float32's exp range, which a chunked kernel factoring
    ``exp(L_t - L_t')`` into ``exp(L_t) exp(-L_t')`` does not survive). Write and read weights are L2-normalised
    per token (as product-key scores after a normalisation), v ~ N(0, 1), beta = sigmoid(randn).

    Returns a dict with ``k_idx, k_val, q_idx, q_val, v, g, beta``, ``num_slots`` and ``key_weighted_decay``, and if
    asked ``initial_bank`` (float32, entries ~ N(0, 1/D)).
    """
    if regime not in SDM_REGIMES:
        raise ValueError(f"unknown sdm regime {regime!r}; expected one of {', '.join(SDM_REGIMES)}")
    if W > S or R > S:
        raise ValueError(f"W={W} and R={R} must not exceed S={S}")
    gen = _in.generator(seed)
    pool = min(S, W + W // 2 + 1) if regime in ("collisions", "strong") else S
    k_idx = _distinct_slots(gen, (B, T, H), pool, W)
    q_idx = _distinct_slots(gen, (B, T, H), max(pool, R), R)
    k_val = _in.l2norm(_in.randn(gen, B, T, H, W))
    if regime == "key_weighted":
        k_val = k_val.abs()
    t: dict[str, torch.Tensor] = {
        "k_val": k_val,
        "q_val": _in.l2norm(_in.randn(gen, B, T, H, R)),
        "v": _in.randn(gen, B, T, H, D),
        "g": _in.log_decay(gen, regime if regime in ("long", "strong") else "typical", B, T, H),
        "beta": _in.strength(gen, B, T, H),
    }
    if initial_bank:
        t["initial_bank"] = _in.randn(gen, B, H, S, D) * D**-0.5
    out: dict[str, torch.Tensor | int | bool] = {"k_idx": k_idx.to(device)}
    floats = _in.finish(t, dtype=dtype, device=device, keep_fp32=("g", "initial_bank"))
    out.update(k_val=floats["k_val"], q_idx=q_idx.to(device))
    out.update(floats)
    out.update(key_weighted_decay=regime == "key_weighted", num_slots=S)
    return out


# The op's contract, for the harness: the dims, inputs and state, the oracle and the generator above.
def _sdm_work(contract: OpContract, dims: Mapping[str, int], elem: int, mode: str) -> dict[str, float]:
    """FLOP and minimum-byte counts of one sdm call: per token and head, the W written slots' decay, read and write
    (about 6 D FLOP each) and the R read slots (2 D each); bytes the I/O floor (references/contract.io_bytes)."""
    B, T, H, D, W, R = (dims[d] for d in ("B", "T", "H", "D", "W", "R"))
    if mode == "decode":
        # the bank's traffic is the slots a token touches: W written (read and written), R read, D float32 each
        inputs, out, _ = io_bytes(contract, dims, elem)
        return decode_work(B * T * H * D * (6 * W + 2 * R), inputs, out, B * T * H * D * 4 * (2 * W + R))
    return fwd_bwd_work(B * T * H * D * (6 * W + 2 * R), *io_bytes(contract, dims, elem), mode)


def _check_sdm_dims(dims: Mapping[str, int]) -> str | None:
    """A token writes W and reads R distinct slots of S: neither may exceed S."""
    if dims["W"] > dims["S"] or dims["R"] > dims["S"]:
        return f"W={dims['W']} and R={dims['R']} distinct slots per token must not exceed the bank's S={dims['S']}"
    return None


CONTRACT = OpContract(
    name="sdm",
    title="Sparse Delta Memory",
    dims=("B", "T", "H", "S", "D", "W", "R"),
    inputs=(
        ArgSpec("k_idx", "BTHW", "index", differentiable=False),
        ArgSpec("k_val", "BTHW"),
        ArgSpec("q_idx", "BTHR", "index", differentiable=False),
        ArgSpec("q_val", "BTHR"),
        ArgSpec("v", "BTHD"),
        ArgSpec("g", "BTH", "float32"),
        ArgSpec("beta", "BTH"),
    ),
    output=ArgSpec("y", "BTHD"),
    state=ArgSpec("initial_bank", "BHSD", "float32", optional=True),
    oracle=sdm_recurrent,
    make_inputs=make_inputs,
    rule=(
        "M[s] <- exp(g) M[s] for s in k_idx (once per slot); r = sum_n k_val[n] M[k_idx[n]]; "
        "M[k_idx[n]] += k_val[n] beta (v - r); y = sum_m q_val[m] M[q_idx[m]]"
    ),
    regimes=SDM_REGIMES,
    work=_sdm_work,
    # the oracle's steps touch W written and R read slots of D values, not the whole bank
    cost_dims=("B", "T", "H", "D", "W"),
    oracle_shrink=("B", "H"),
    # a padded token (slot 0 written W times) is a repeated write, which the oracle refuses
    zero_token_is_identity=False,
    options=("key_weighted_decay", "num_slots"),
    # every kernel of the op is built to give the same bits on every call (kernels/sdm): the gate holds it to that
    deterministic=True,
    check_dims=_check_sdm_dims,
    decode=True,
)
