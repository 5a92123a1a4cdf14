"""Gated DeltaNet decode step in Triton (impl ``triton_decode``): one launch per step of T = 1..8 new tokens.

One program per (V block, batch*head) loads its ``[K, BV]`` slice of the float32 state, and per token applies the
gate (decay) first, then the delta update, then the output; the slice is stored back into the very buffer it was read
from (each program reads its slice whole before it writes it, and no two programs share one), so the state cache is
updated in place and no new state is allocated. Four kernels: :func:`decode_step_kernel` loads every token's
inputs with the state at once; :func:`decode_chunk_kernel` does too and steps them as one chunk;
:mod:`.fused_recurrent`'s walks the tokens, prefetching the next; GDN-2's and KDA's decode kernel
(kernels/common/triton/decode.py) does too, and may run persistent, each program loading its next tile of the state
while it steps this one. :func:`decode_launch` picks the kernel, V block and warps by the step's shape.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...common.decode import require_state_cache
from ...common.triton.decode import launch_delta_decode
from .fused_recurrent import fused_recurrent_fwd_kernel

__all__ = [
    "decode_chunk_kernel",
    "decode_launch",
    "decode_step_kernel",
    "gdn_triton_decode",
    "launch_decode",
]


@triton.jit
def _step_rows(T, H: tl.constexpr, BT: tl.constexpr):
    """The (batch, token, head) rows of this program's BT token slots (slots past T name no token)."""
    i_bh = tl.program_id(1)
    return ((i_bh // H) * T + tl.arange(0, BT)).to(tl.int64) * H + i_bh % H


@triton.jit
def _load_step(q, k, v, g, beta, state, T, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr,
               BV: tl.constexpr, BT: tl.constexpr):  # fmt: skip
    """This program's step, loaded at once: every token's k, q ``[BT, BK]``, v ``[BT, BV]``, g and beta ``[BT]``
    (rows past T zero) in float32, and its ``[BK, BV]`` slice of the state."""
    rk = tl.arange(0, BK)
    rv = tl.program_id(0) * BV + tl.arange(0, BV)
    mk, mv, mt = rk < K, rv < V, tl.arange(0, BT) < T
    rows = _step_rows(T, H, BT)
    kk = tl.load(k + rows[:, None] * K + rk[None, :], mask=mt[:, None] & mk[None, :], other=0.0).to(tl.float32)
    qq = tl.load(q + rows[:, None] * K + rk[None, :], mask=mt[:, None] & mk[None, :], other=0.0).to(tl.float32)
    vv = tl.load(v + rows[:, None] * V + rv[None, :], mask=mt[:, None] & mv[None, :], other=0.0).to(tl.float32)
    gg = tl.load(g + rows, mask=mt, other=0.0).to(tl.float32)
    bb = tl.load(beta + rows, mask=mt, other=0.0).to(tl.float32)
    S = tl.load(state + _state_offsets(K, V, BK, BV), mask=mk[:, None] & mv[None, :], other=0.0)
    return kk, qq, vv, gg, bb, S


@triton.jit
def _state_offsets(K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    """Offsets of this program's ``[BK, BV]`` slice in the ``[B*H, K, V]`` state."""
    rv = tl.program_id(0) * BV + tl.arange(0, BV)
    return tl.program_id(1).to(tl.int64) * K * V + tl.arange(0, BK)[:, None] * V + rv[None, :]


@triton.jit
def _store_step(o, state, out, S, T, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr,
                BV: tl.constexpr, BT: tl.constexpr):  # fmt: skip
    """Store this program's outputs ``[BT, BV]`` (rows past T dropped) and its slice of the new state."""
    rk = tl.arange(0, BK)
    rv = tl.program_id(0) * BV + tl.arange(0, BV)
    mv = rv < V
    rows = _step_rows(T, H, BT)
    tl.store(
        o + rows[:, None] * V + rv[None, :],
        out.to(o.dtype.element_ty),
        mask=(tl.arange(0, BT) < T)[:, None] & mv[None, :],
    )
    tl.store(state + _state_offsets(K, V, BK, BV), S, mask=(rk < K)[:, None] & mv[None, :])


@triton.jit
def decode_step_kernel(
    q, k, v, g, beta, state, o,
    scale, T,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr,
    LAZY: tl.constexpr = False,
):  # fmt: skip
    """One (V block, batch*head) of a decode step of T <= BT tokens: every token's inputs and the state slice are
    loaded at once (one memory latency, not one a token), the tokens stepped in registers, then the outputs and the
    state stored once.

    `LAZY`: the decay is a scalar `a` carried beside the slice P (the state is ``a P``) and applied to P once, at the
    end, so a token costs three passes over the slice (``P^T k``, ``P += k (u / a)^T``, ``P^T q``), not four. P is
    rescaled whenever `a` falls under 2^-50, so ``1 / a`` stays far from float32's range whatever the log-decays."""
    kk, qq, vv, gg, bb, S = _load_step(q, k, v, g, beta, state, T, H, K, V, BK, BV, BT)
    rt = tl.arange(0, BT)
    out = tl.zeros([BT, BV], dtype=tl.float32)
    a = tl.full([], 1.0, tl.float32)
    for t in range(T):
        sel = rt == t
        kt = tl.sum(tl.where(sel[:, None], kk, 0.0), axis=0)
        qt = tl.sum(tl.where(sel[:, None], qq, 0.0), axis=0) * scale
        vt = tl.sum(tl.where(sel[:, None], vv, 0.0), axis=0)
        decay = tl.exp(tl.sum(tl.where(sel, gg, 0.0)))
        bt = tl.sum(tl.where(sel, bb, 0.0))
        if LAZY:
            a = a * decay
            if a < 8.881784197001252e-16:  # 2^-50
                S = S * a
                a = tl.full([], 1.0, tl.float32)
            ut = bt * (vt - a * tl.sum(S * kt[:, None], axis=0))
            S += kt[:, None] * (ut / a)[None, :]
            ot = a * tl.sum(S * qt[:, None], axis=0)
        else:
            S = S * decay
            ut = bt * (vt - tl.sum(S * kt[:, None], axis=0))
            S += kt[:, None] * ut[None, :]
            ot = tl.sum(S * qt[:, None], axis=0)
        out = tl.where(sel[:, None], ot[None, :], out)
    if LAZY:
        S = S * a
    _store_step(o, state, out, S, T, H, K, V, BK, BV, BT)


@triton.jit
def decode_chunk_kernel(
    q, k, v, g, beta, state, o,
    scale, T,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
):  # fmt: skip
    """One (V block, batch*head) of a decode step of T <= 16 tokens as one chunk of the chunked form: the tokens'
    products with the state (K S, Q S) and the state's update (K^T U) as matrix products over all tokens at once,
    and only the T x T triangular solve for the new values U token by token. Every product touching the state is
    3xTF32 (float32-accurate), so the state keeps float32 accuracy over many steps.

    With cumulative log-decays c_t, D_ij = exp(c_i - c_j) (j <= i), and S0 the state before the step::

        U = (I + tril(beta K K^T * D, -1))^-1 beta (V - exp(c) * K S0)
        O = scale (exp(c) * Q S0 + tril(Q K^T * D) U)
        S = exp(c_T) S0 + K^T (exp(c_T - c) * U)
    """
    BT: tl.constexpr = 16
    kk, qq, vv, gg, bb, S = _load_step(q, k, v, g, beta, state, T, H, K, V, BK, BV, BT)
    rt = tl.arange(0, BT)
    mt = rt < T
    c = tl.cumsum(gg, axis=0)  # padded tokens add 0: c stays at the last token's
    c_last = tl.sum(tl.where(rt == T - 1, c, 0.0))
    lower = rt[:, None] > rt[None, :]
    decay = tl.where(rt[:, None] >= rt[None, :], tl.exp(c[:, None] - c[None, :]), 0.0)
    ks = tl.dot(kk, S, input_precision="tf32x3")
    qs = tl.dot(qq, S, input_precision="tf32x3")
    kkt = tl.dot(kk, tl.trans(kk), input_precision="tf32x3")
    qkt = tl.dot(qq, tl.trans(kk), input_precision="tf32x3")
    a = tl.where(lower, bb[:, None] * kkt * decay, 0.0)
    r = bb[:, None] * (vv - tl.exp(c)[:, None] * ks)
    u = tl.zeros([BT, BV], dtype=tl.float32)
    for t in range(T):  # forward substitution: u_t = r_t - sum_{j<t} a_tj u_j
        sel = rt == t
        a_t = tl.sum(tl.where(sel[:, None], a, 0.0), axis=0)
        u_t = tl.sum(tl.where(sel[:, None], r, 0.0), axis=0) - tl.sum(a_t[:, None] * u, axis=0)
        u = tl.where(sel[:, None], u_t[None, :], u)
    out = tl.exp(c)[:, None] * qs + tl.dot(qkt * decay, u, input_precision="tf32x3")
    w = tl.where(mt, tl.exp(c_last - c), 0.0)
    S = S * tl.exp(c_last) + tl.dot(tl.trans(kk * w[:, None]), u, input_precision="tf32x3")
    _store_step(o, state, scale * out, S, T, H, K, V, BK, BV, BT)


def decode_launch(B: int, H: int, V: int, T: int) -> dict[str, int | str]:
    """The decode launch for `B` sequences of `H` heads, `V` value columns and `T` new tokens: kernel, V block and
    warps, from benchmarks/gpu/decode_tune.py's sweep on the H200 (NOTES.md). One warp a program once a step has
    several tokens: each token's two reductions over K then stay inside the warp, and many one-warp programs hide
    each other's latency. Wide V blocks when B*H heads fill the machine anyway (fewer, longer state streams); small
    ones when they are few. Past 4 tokens the loaded-at-once kernel holds too much in registers: the token-serial
    one, each token's inputs prefetched, is faster there."""
    heads = B * H
    if T > 4:
        launch = {"kernel": "prefetch" if heads >= 1024 else "all", "BV": 16, "num_warps": 1}
    elif T > 2:
        launch = {"kernel": "all", "BV": 32 if heads >= 1024 else 16, "num_warps": 1}
    elif heads >= 4096:
        launch = {"kernel": "all", "BV": 64, "num_warps": 2}
    elif heads >= 1024:
        launch = {"kernel": "all", "BV": 32, "num_warps": 1}
    else:
        launch = {"kernel": "all", "BV": 16, "num_warps": 4 if T == 1 else 1}
    launch["BV"] = min(int(launch["BV"]), max(16, triton.next_power_of_2(V)))
    return launch


def launch_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    o: torch.Tensor,
    scale: float,
    *,
    BV: int,
    num_warps: int,
    kernel: str = "all",
    per_sm: int = 8,
    fused: bool = True,
    lazy: bool = False,
) -> None:
    """One decode launch on contiguous inputs: `state` (``[B, H, K, V]`` float32) updated in place, `o` written.
    `kernel`: ``chunk`` (:func:`decode_chunk_kernel`: the tokens as one chunk, matrix products on tensor cores),
    ``all`` (:func:`decode_step_kernel`: every token's inputs loaded at once), ``lazy`` (the same, its decay a
    scalar applied once a step: ``LAZY``), ``prefetch`` (the token-serial
    kernel of :mod:`.fused_recurrent`, the next token's inputs loaded during this token's update) or ``persist``
    (kernels/common/triton/decode.py: `per_sm` programs an SM, each stepping tiles in turn with the next tile's
    state loaded during this one's tokens; `fused`, `lazy`: its token forms)."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    BK = max(16, triton.next_power_of_2(K))
    grid = (triton.cdiv(V, BV), B * H)
    if kernel == "chunk":
        if T > 16:
            raise ValueError(f"the chunk kernel steps at most 16 tokens, got T={T}")
        decode_chunk_kernel[grid](
            q, k, v, g, beta, state, o, scale, T,
            H=H, K=K, V=V, BK=BK, BV=BV, num_warps=num_warps, num_stages=1,
        )  # fmt: skip
        return
    if kernel in ("all", "lazy"):
        decode_step_kernel[grid](
            q, k, v, g, beta, state, o, scale, T,
            H=H, K=K, V=V, BK=BK, BV=BV, BT=max(2, triton.next_power_of_2(T)), LAZY=kernel == "lazy",
            num_warps=num_warps, num_stages=1,
        )  # fmt: skip
        return
    if kernel == "persist":
        launch_delta_decode(q, k, v, g, beta, beta, state, o, scale, BV=BV, num_warps=num_warps, per_sm=per_sm,
                            fused=fused, lazy=lazy)  # fmt: skip
        return
    if kernel != "prefetch":
        raise ValueError(f"kernel is 'chunk', 'all', 'lazy', 'prefetch' or 'persist', got {kernel!r}")
    fused_recurrent_fwd_kernel[grid](
        q, k, v, g, beta, state, o, state, scale, T,
        H=H, K=K, V=V, BK=BK, BV=BV, HAS_H0=True, STORE_FINAL=True, num_warps=num_warps, num_stages=1,
    )  # fmt: skip


def gdn_triton_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """T new tokens (q, k ``[B, T, H, K]``, v ``[B, T, H, V]``, g, beta ``[B, T, H]``) from `initial_state`
    (``[B, H, K, V]`` float32 contiguous, updated in place and returned); o ``[B, T, H, V]`` in v's dtype."""
    state = require_state_cache(initial_state)
    B, T, H, K = q.shape
    scale = K**-0.5 if scale is None else scale
    q, k, v, g, beta = q.contiguous(), k.contiguous(), v.contiguous(), g.contiguous(), beta.contiguous()
    o = torch.empty_like(v)
    with torch.no_grad():
        launch_decode(q, k, v, g, beta, state, o, scale, **decode_launch(B, H, v.shape[-1], T))
    return o, state
