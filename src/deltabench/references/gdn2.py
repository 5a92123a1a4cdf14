"""Float64 token-serial oracle for Gated DeltaNet-2 (GDN-2).

Layout: q, k, g, b [B, T, H, K]; v, w [B, T, H, V]; state [B, H, K, V]. `g` is a per-channel
log-decay (<= 0). Per token t, for each (b, h)::

    S <- Diag(exp g_t) S
    r  = S^T (b_t * k_t)
    S <- S + k_t (w_t * v_t - r)^T
    o_t = S^T (scale * q_t)

With b = w = beta (broadcast) this is KDA; with g also broadcast over K it is GDN.
"""

from __future__ import annotations

import torch

from . import _inputs as _in
from .contract import ArgSpec, delta_contract

__all__ = ["CONTRACT", "gdn2_recurrent", "make_inputs"]


def gdn2_recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    b: torch.Tensor,
    w: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run GDN-2 one token at a time in float64.

    Args:
        q, k: ``[B, T, H, K]``.
        v: ``[B, T, H, V]``.
        g: ``[B, T, H, K]`` per-channel log-decay.
        b: ``[B, T, H, K]`` erase strength per key channel.
        w: ``[B, T, H, V]`` write strength per value channel.
        scale: query scale, default ``K ** -0.5``.
        initial_state: optional ``[B, H, K, V]``.

    Returns:
        ``(o, final_state)`` in float64: ``[B, T, H, V]`` and ``[B, H, K, V]``.
    """
    B, T, H, K = q.shape
    V = v.shape[-1]
    scale = K**-0.5 if scale is None else scale
    q, k, v, g, b, w = (x.to(torch.float64) for x in (q, k, v, g, b, w))
    S = q.new_zeros(B, H, K, V) if initial_state is None else initial_state.to(torch.float64)
    outs = []
    for t in range(T):
        S = S * g[:, t].exp()[..., None]
        kt = k[:, t]
        r = torch.einsum("bhk,bhkv->bhv", b[:, t] * kt, S)
        S = S + kt[..., :, None] * (w[:, t] * v[:, t] - r)[..., None, :]
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, t] * scale, S))
    o = torch.stack(outs, dim=1) if outs else v.new_zeros(B, 0, H, V)
    return o, S


def make_inputs(
    B: int,
    T: int,
    H: int,
    K: int,
    V: int,
    *,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    seed: int = 0,
    regime: str = "typical",
    initial_state: bool = False,
    unit_qk: bool = True,
) -> dict[str, torch.Tensor]:
    """Seeded GDN-2 inputs: L2-normalised q/k (``unit_qk=False``: drawn norms),
    N(0,1) v, per-channel gates of `regime`,
    b and w = sigmoid(randn) per channel.

    Returns a dict with keys ``q, k, v, g, b, w`` and, if asked, ``initial_state`` (float32).
    """
    gen = _in.generator(seed, device)  # drawn where the inputs go (_inputs.py: the draws depend on it)
    t = {
        "q": _in.direction(gen, B, T, H, K, norms=None if unit_qk else _in.Q_NORMS),
        "k": _in.direction(gen, B, T, H, K, norms=None if unit_qk else _in.K_NORMS),
        "v": _in.randn(gen, B, T, H, V),
        "g": _in.log_decay(gen, regime, B, T, H, K),
        "b": _in.strength(gen, B, T, H, K),
        "w": _in.strength(gen, B, T, H, V),
    }
    if initial_state:
        t["initial_state"] = _in.state(gen, B, H, K, V)
    return _in.finish(t, dtype=dtype, device=device)


# The op's contract: q, k, v, then its gates (the log-decay kept in float32), with the delta family's layout.
CONTRACT = delta_contract(
    "gdn2",
    "Gated DeltaNet-2",
    (ArgSpec("g", "BTHK", "float32"), ArgSpec("b", "BTHK"), ArgSpec("w", "BTHV")),
    oracle=gdn2_recurrent,
    make_inputs=make_inputs,
    rule="S <- Diag(exp g) S; r = S^T (b*k); S <- S + k (w*v - r)^T; o = S^T (scale q)",
)
