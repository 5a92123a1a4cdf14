"""Float64 oracle of a GatedDeltaNet mixer block (``gdn_layer``): the op's contract, its block and its inputs.

Per batch row, from ``x [T, D]`` (weights per row: the op is B layers side by side, and ``make_inputs`` draws the
same weights for every row, so a row is one sequence through one layer)::

    q, k, v = x W_q, x W_k, x W_v                      H heads of K, K, V channels
    q, k, v = silu(causal depthwise conv, width 4)     on each of the 2HK + HV channels
    q, k    = l2norm(q), l2norm(k)                     over K
    beta    = sigmoid(x W_b)                           [T, H]
    g       = -softplus(x W_a + dt_bias) * exp(A_log)  [T, H], the log-decay
    o, S    = the delta rule (references/gdn.py) with scale K ** -0.5
    o       = rmsnorm(o) * norm_w * silu(x W_gate)     the norm over V, per head
    y       = o W_o                                    [T, D]

The state is one float32 tensor ``[B, 3 * C + H * K * V]`` (C = 2HK + HV): the conv history, the last 3 tokens'
projections (q, k, v channels side by side, oldest first; zeros before the first token), then the recurrent state
``[H, K, V]``, each flattened row-major (:func:`pack_state`, :func:`unpack_state`). Carrying both makes streaming
exact: T1 tokens then T2 from the returned state equal T1 + T2 tokens.

Nothing here imports the rest of deltabench.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import torch
import torch.nn.functional as F

from . import _inputs as _in
from .contract import REGIMES, ArgSpec, OpContract, fwd_bwd_work, io_bytes
from .gdn import gdn_recurrent

__all__ = ["CONTRACT", "CONV", "WEIGHTS", "gdn_layer_block", "gdn_layer_oracle", "make_inputs", "pack_state"]

# The width of the short causal conv (FLA's conv_size): each channel sees its token and the 3 before.
CONV = 4
# The input names after x, in call order.
WEIGHTS = (
    "w_q",
    "w_k",
    "w_v",
    "conv_q",
    "conv_k",
    "conv_v",
    "w_b",
    "w_a",
    "a_log",
    "dt_bias",
    "norm_w",
    "w_gate",
    "w_o",
)
_NORM_EPS = 1e-6

# A recurrence: (q, k, v, g, beta, scale=, initial_state=) -> (o, final_state), as every gdn impl is called.
Recurrence = Callable[..., tuple[torch.Tensor, torch.Tensor]]


def channels(H: int, K: int, V: int) -> int:
    """The conv's channels: q's and k's H*K each, then v's H*V."""
    return 2 * H * K + H * V


def state_width(dims: Mapping[str, int]) -> int:
    """Elements of one row of the packed state: the conv history then the recurrent state."""
    H, K, V = dims["H"], dims["K"], dims["V"]
    return (CONV - 1) * channels(H, K, V) + H * K * V


def pack_state(history: torch.Tensor, S: torch.Tensor) -> torch.Tensor:
    """One state tensor ``[B, 3*C + H*K*V]`` from the conv history ``[B, 3, C]`` and the recurrent state."""
    return torch.cat([history.flatten(1), S.flatten(1)], dim=1)


def unpack_state(state: torch.Tensor, H: int, K: int, V: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The conv history ``[B, 3, C]`` and the recurrent state ``[B, H, K, V]`` of a packed state."""
    B, C = state.shape[0], channels(H, K, V)
    cut = (CONV - 1) * C
    return state[:, :cut].reshape(B, CONV - 1, C), state[:, cut:].reshape(B, H, K, V)


def causal_conv(pre: torch.Tensor, weight: torch.Tensor, history: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Depthwise causal conv of ``pre [B, T, C]`` with ``weight [B, 4, C]`` (the last tap on the token itself) after
    ``history [B, 3, C]``; returns (the conv's output, the new history: the last 3 tokens of history + pre)."""
    T = pre.shape[1]
    full = torch.cat([history, pre], dim=1)
    out = sum(weight[:, j, None, :] * full[:, j : j + T] for j in range(CONV))
    return out, full[:, full.shape[1] - (CONV - 1) :]


def gated_norm(o: torch.Tensor, norm_w: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """The output norm: RMSNorm of ``o [B, T, H, V]`` over V with weight ``norm_w [B, V]``, times ``silu(gate)``."""
    return o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + _NORM_EPS) * norm_w[:, None, None] * F.silu(gate)


def gdn_layer_block(
    recurrence: Recurrence,
    compute: torch.dtype,
    x: torch.Tensor,
    *weights: torch.Tensor,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The mixer block around `recurrence`, everything but the recurrence in `compute` (the oracle's float64, an
    impl's float32 or a model's 16-bit dtype; the log-decay in float32 at least); returns ``(y [B, T, D], packed
    final state)``, y in `compute`, the state in float32 or `compute` whichever is wider."""
    w = dict(zip(WEIGHTS, (t.to(compute) for t in weights), strict=True))
    x = x.to(compute)
    B, T, _ = x.shape
    _, _, H, K = w["w_q"].shape
    V = w["w_v"].shape[-1]
    # The state stays in float32 (float64 for the oracle) when the block computes in a 16-bit dtype.
    wide = torch.float64 if compute == torch.float64 else torch.float32
    if initial_state is None:
        history = x.new_zeros(B, CONV - 1, channels(H, K, V))
        S0 = None
    else:
        history, S0 = unpack_state(initial_state.to(wide), H, K, V)
        history = history.to(compute)
    proj = [torch.einsum("btd,bdhk->bthk", x, w[n]).flatten(2) for n in ("w_q", "w_k", "w_v")]
    kernel = torch.cat([w[n].flatten(2) for n in ("conv_q", "conv_k", "conv_v")], dim=2)
    mixed, history = causal_conv(torch.cat(proj, dim=2), kernel, history)
    q, k, v = F.silu(mixed).split([H * K, H * K, H * V], dim=2)
    q, k, v = q.reshape(B, T, H, K), k.reshape(B, T, H, K), v.reshape(B, T, H, V)
    q, k = _in.l2norm(q), _in.l2norm(k)
    beta = torch.sigmoid(torch.einsum("btd,bdh->bth", x, w["w_b"]))
    a = torch.einsum("btd,bdh->bth", x, w["w_a"]) + w["dt_bias"][:, None]
    g = -F.softplus(a) * w["a_log"].exp()[:, None]
    o, S = recurrence(q, k, v, g.float() if compute != torch.float64 else g, beta, scale=K**-0.5, initial_state=S0)
    o = gated_norm(o.to(compute), w["norm_w"], torch.einsum("btd,bdhv->bthv", x, w["w_gate"]))
    y = torch.einsum("bthv,bhvd->btd", o, w["w_o"])
    return y, pack_state(history.to(wide), S.to(wide))


def gdn_layer_oracle(
    x: torch.Tensor, *weights: torch.Tensor, initial_state: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The block in float64, the conv and the recurrence stepped token by token; returns ``(y [B, T, D], packed
    final state)``, both float64.

    Written on its own, sharing no code with the impls' block (:func:`gdn_layer_block`, which kernels/gdn_layer and
    lm_step's model run): the conv keeps its window of the last 3 projections as a list of rows, and the recurrence
    is gdn's oracle (references/gdn.gdn_recurrent), so that a bug in the block fails the gate."""
    w = dict(zip(WEIGHTS, (t.to(torch.float64) for t in weights), strict=True))
    x = x.to(torch.float64)
    B, T, _ = x.shape
    H, K, V = w["w_q"].shape[2], w["w_q"].shape[3], w["w_v"].shape[3]
    if initial_state is None:
        history, S0 = x.new_zeros(B, CONV - 1, channels(H, K, V)), None
    else:
        history, S0 = unpack_state(initial_state.to(torch.float64), H, K, V)
    # Every token's projections, the q, k and v channels side by side as in the history: [B, T, C].
    pre = torch.cat([torch.einsum("btd,bdhk->bthk", x, w[n]).flatten(2) for n in ("w_q", "w_k", "w_v")], 2)
    taps = torch.cat([w[n].reshape(B, CONV, -1) for n in ("conv_q", "conv_k", "conv_v")], dim=2)  # [B, 4, C]
    window = list(history.unbind(1))  # the 3 tokens before this one, oldest first
    mixed = []
    for t in range(T):
        window.append(pre[:, t])
        mixed.append(sum(taps[:, j] * window[j] for j in range(CONV)))
        window.pop(0)
    conv = torch.stack(mixed, dim=1) if mixed else pre
    act = conv * torch.sigmoid(conv)
    q, k, v = act[..., : H * K], act[..., H * K : 2 * H * K], act[..., 2 * H * K :]
    q, k, v = _in.l2norm(q.reshape(B, T, H, K)), _in.l2norm(k.reshape(B, T, H, K)), v.reshape(B, T, H, V)
    beta = torch.sigmoid(torch.einsum("btd,bdh->bth", x, w["w_b"]))
    a = torch.einsum("btd,bdh->bth", x, w["w_a"]) + w["dt_bias"][:, None]
    g = -F.softplus(a) * w["a_log"].exp()[:, None]
    o, S = gdn_recurrent(q, k, v, g, beta, scale=K**-0.5, initial_state=S0)
    rms = (o.pow(2).mean(-1, keepdim=True) + _NORM_EPS).sqrt()
    z = torch.einsum("btd,bdhv->bthv", x, w["w_gate"])
    o = o / rms * w["norm_w"][:, None, None] * (z * torch.sigmoid(z))
    y = torch.einsum("bthv,bhvd->btd", o, w["w_o"])
    return y, pack_state(torch.stack(window, dim=1), S)


# exp(A_log) per regime: typical decays of a few tokens to tens, long barely decays, strong forgets within a token.
_DECAY_RATE = {"typical": (0.05, 0.5), "long": (1e-3, 1e-2), "strong": (1.0, 8.0)}


def make_inputs(
    B: int,
    T: int,
    D: int,
    H: int,
    K: int,
    V: int,
    *,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    seed: int = 0,
    regime: str = "typical",
    initial_state: bool = False,
) -> dict[str, torch.Tensor]:
    """Seeded inputs: x ~ N(0, 1); projections N(0, 1/fan_in); conv taps N(0, 1/4); norm weights 1 + N(0, 0.01);
    exp(A_log) uniform in the regime's range, log-uniformly; dt_bias N(0, 1). The weights are drawn once and
    repeated in every batch row. With `initial_state`, a packed state of N(0, 1) conv history and a random
    recurrent state."""
    if regime not in _DECAY_RATE:
        raise ValueError(f"unknown gate regime {regime!r}; expected one of {', '.join(REGIMES)}")
    gen = _in.generator(seed, device)
    lo, hi = _DECAY_RATE[regime]
    u = torch.rand(1, H, generator=gen, dtype=torch.float32, device=gen.device)
    one = {
        "w_q": _in.randn(gen, 1, D, H, K) * D**-0.5,
        "w_k": _in.randn(gen, 1, D, H, K) * D**-0.5,
        "w_v": _in.randn(gen, 1, D, H, V) * D**-0.5,
        "conv_q": _in.randn(gen, 1, CONV, H, K) * CONV**-0.5,
        "conv_k": _in.randn(gen, 1, CONV, H, K) * CONV**-0.5,
        "conv_v": _in.randn(gen, 1, CONV, H, V) * CONV**-0.5,
        "w_b": _in.randn(gen, 1, D, H) * D**-0.5,
        "w_a": _in.randn(gen, 1, D, H) * D**-0.5,
        "a_log": math.log(lo) + u * (math.log(hi) - math.log(lo)),
        "dt_bias": _in.randn(gen, 1, H),
        "norm_w": 1 + 0.1 * _in.randn(gen, 1, V),
        "w_gate": _in.randn(gen, 1, D, H, V) * D**-0.5,
        "w_o": _in.randn(gen, 1, H, V, D) * (H * V) ** -0.5,
    }
    t = {"x": _in.randn(gen, B, T, D), **{n: one[n].expand(B, *one[n].shape[1:]) for n in WEIGHTS}}
    if initial_state:
        history = _in.randn(gen, B, CONV - 1, channels(H, K, V))
        t["initial_state"] = pack_state(history, _in.state(gen, B, H, K, V))
    return _in.finish(t, dtype=dtype, device=device)


def _conv_taps(last: str) -> Callable[[Mapping[str, int]], tuple[int, ...]]:
    return lambda d: (d["B"], CONV, d["H"], d[last])


def _layer_work(contract: OpContract, dims: Mapping[str, int], elem: int, mode: str) -> dict[str, float]:
    """The projections' 2*D*(2HK + 3HV) + 2*H*V*D FLOP per token, plus the chunked recurrence's (references/
    contract.chunked_delta_work's per-token figure), the I/O floor for bytes."""
    B, T, D, H, K, V = (dims[d] for d in ("B", "T", "D", "H", "K", "V"))
    proj = 2 * D * (2 * H * K + 3 * H * V) + 2 * H * V * D
    C = 64
    recurrence = H * (5 * C * (K + V) + 6 * K * V + C * C / 3)
    return fwd_bwd_work(B * T * (proj + recurrence), *io_bytes(contract, dims, elem), mode)


CONTRACT = OpContract(
    name="gdn_layer",
    title="GatedDeltaNet mixer block",
    dims=("B", "T", "D", "H", "K", "V"),
    inputs=(
        ArgSpec("x", "BTD"),
        ArgSpec("w_q", "BDHK"),
        ArgSpec("w_k", "BDHK"),
        ArgSpec("w_v", "BDHV"),
        ArgSpec("conv_q", "BHK", extent=_conv_taps("K")),
        ArgSpec("conv_k", "BHK", extent=_conv_taps("K")),
        ArgSpec("conv_v", "BHV", extent=_conv_taps("V")),
        ArgSpec("w_b", "BDH"),
        ArgSpec("w_a", "BDH"),
        ArgSpec("a_log", "BH"),
        ArgSpec("dt_bias", "BH"),
        ArgSpec("norm_w", "BV"),
        ArgSpec("w_gate", "BDHV"),
        ArgSpec("w_o", "BHVD"),
    ),
    output=ArgSpec("y", "BTD"),
    state=ArgSpec("initial_state", "BHKV", "float32", optional=True, extent=lambda d: (d["B"], state_width(d))),
    oracle=gdn_layer_oracle,
    make_inputs=make_inputs,
    rule="q,k,v = silu(conv4(x W)); l2norm q,k; delta rule; y = (rmsnorm(o) * silu(x W_gate)) W_o",
    dim_defaults=(("V", "K"),),
    work=_layer_work,
    oracle_shrink=("B", "H"),
    zero_token_is_identity=False,
    reference_impl="torch_layer",
)
