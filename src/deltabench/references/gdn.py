"""Float64 token-serial oracle for Gated DeltaNet (GDN).

Layout (FLA's): q, k [B, T, H, K]; v [B, T, H, V]; g, beta [B, T, H]; state [B, H, K, V].
`g` is a log-decay (<= 0). Per token t, for each (b, h)::

    S <- exp(g_t) * S
    u  = beta_t * (v_t - S^T k_t)
    S <- S + k_t u^T
    o_t = S^T (scale * q_t)

Everything is computed in float64 whatever the input dtype; the loop is plain autograd-friendly
PyTorch so that float64 gradients come from differentiating it.
"""

from __future__ import annotations

import torch

from . import _inputs as _in
from .contract import ArgSpec, delta_contract

__all__ = ["CONTRACT", "gdn_recurrent", "make_inputs"]


def gdn_recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run GDN one token at a time in float64.

    Args:
        q, k: ``[B, T, H, K]`` queries and keys (used as given; callers L2-normalise them).
        v: ``[B, T, H, V]`` values.
        g: ``[B, T, H]`` log-decay per token and head.
        beta: ``[B, T, H]`` write strength.
        scale: query scale, default ``K ** -0.5``.
        initial_state: optional ``[B, H, K, V]`` state before the first token.

    Returns:
        ``(o, final_state)``: ``[B, T, H, V]`` and ``[B, H, K, V]``, both float64.
    """
    B, T, H, K = q.shape
    V = v.shape[-1]
    scale = K**-0.5 if scale is None else scale
    q, k, v, g, beta = (x.to(torch.float64) for x in (q, k, v, g, beta))
    if initial_state is None:
        S = q.new_zeros(B, H, K, V)
    else:
        S = initial_state.to(torch.float64)
    outs = []
    for t in range(T):
        S = S * g[:, t].exp()[..., None, None]
        kt = k[:, t]
        u = beta[:, t, :, None] * (v[:, t] - torch.einsum("bhk,bhkv->bhv", kt, S))
        S = S + kt[..., :, None] * u[..., None, :]
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
    """Seeded GDN inputs: L2-normalised q/k (``unit_qk=False``: drawn norms),
    N(0,1) v, gates of `regime`, beta = sigmoid(randn).

    Returns a dict with keys ``q, k, v, g, beta`` and, if asked, ``initial_state`` (float32).
    """
    gen = _in.generator(seed, device)  # drawn where the inputs go (_inputs.py: the draws depend on it)
    t = {
        "q": _in.direction(gen, B, T, H, K, norms=None if unit_qk else _in.Q_NORMS),
        "k": _in.direction(gen, B, T, H, K, norms=None if unit_qk else _in.K_NORMS),
        "v": _in.randn(gen, B, T, H, V),
        "g": _in.log_decay(gen, regime, B, T, H),
        "beta": _in.strength(gen, B, T, H),
    }
    if initial_state:
        t["initial_state"] = _in.state(gen, B, H, K, V)
    return _in.finish(t, dtype=dtype, device=device)


# The op's contract: q, k, v, then its gates (the log-decay kept in float32), with the delta family's layout.
CONTRACT = delta_contract(
    "gdn",
    "Gated DeltaNet",
    (ArgSpec("g", "BTH", "float32"), ArgSpec("beta", "BTH")),
    oracle=gdn_recurrent,
    make_inputs=make_inputs,
    rule="S <- exp(g) S; u = beta (v - S^T k); S <- S + k u^T; o = S^T (scale q)",
)
