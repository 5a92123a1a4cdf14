"""jax_chunk's sub-blocked pairwise scores against the plain broadcast form, in float64.

``_pairwise_scores`` builds ``sum_c left_i[c] exp(G_i[c] - G_j[c]) right_j[c]`` (i > j, or i >= j) from matmuls
through a reference row per sub-block; the reference here is the ``[C, C, K]`` broadcast product it replaced, in
float64. Every gate regime of the input draws, plus log-decays down to -5 a token on every channel (``exp(G_i -
G_j)`` down to ~1e-140 within a chunk, far below float32) and channels mixing -5 with ~0; strict and not; C = 64,
C = 48 (three sub-blocks) and C = 40 (padded to whole sub-blocks). The gradients too, through ``jax.checkpoint``.
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("DELTABENCH_JAX_FAST_COMPILE", "1")

import numpy as np
import pytest
import torch

from deltabench.references import _inputs

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

from deltabench.kernels.gdn2.jax.jax_chunk import _pairwise_scores  # noqa: E402

K = 32
BATCH = 3  # independent chunks per case
# Per element: |got - want| <= BOUND * (1 + max_c |G_i[c] - G_j[c]|) * sum_c |left_i[c]| exp(G_i[c] - G_j[c])
# |right_j[c]| + FLOOR. The (1 + span) factor is float32's own: G_i - G_j, rounded to float32, is off by up to
# 2^-24 |G_i - G_j|, and so is the decay relatively, in any float32 form (the broadcast one in float32 is off by as
# much: seen <= 1e-7 scaled, both forms). FLOOR: entries whose terms are below float32's normal range (1.2e-38)
# cannot keep their relative precision in any float32 form either. Whole matrices: relative Frobenius < FRO_BOUND
# (seen: <= 1e-7).
BOUND = 1e-6
FLOOR = 1e-36
FRO_BOUND = 1e-6
GRAD_BOUND = 1e-5  # relative Frobenius, per gradient (seen: <= 1e-6)
GATES = ("typical", "long", "strong", "minus5", "mixed")


def broadcast_scores(G: np.ndarray, left: np.ndarray, right: np.ndarray, strict: bool) -> np.ndarray:
    """The broadcast form jax_chunk used before its sub-blocks (``[..., C, C, K]`` decays), in NumPy float64."""
    C = G.shape[-2]
    i, j = np.arange(C)[:, None], np.arange(C)[None, :]
    mask = ((i > j) if strict else (i >= j))[..., None]
    decay = np.where(mask, np.exp(np.where(mask, G[..., :, None, :] - G[..., None, :, :], 0.0)), 0.0)
    return np.sum(left[..., :, None, :] * decay * right[..., None, :, :], axis=-1)


def broadcast_magnitude(G: np.ndarray, left: np.ndarray, right: np.ndarray, strict: bool) -> np.ndarray:
    """``sum_c |left_i[c]| exp(G_i[c] - G_j[c]) |right_j[c]|``: the scale a float32 sum's error is relative to."""
    return broadcast_scores(G, np.abs(left), np.abs(right), strict)


def draw(gate: str, C: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """float32 ``G`` (cumulative log-decay of `gate`), ``left``, ``right``, each ``[BATCH, C, K]``."""
    gen = _inputs.generator(seed)
    if gate in _inputs.REGIMES:
        # [B, T, H, K] with H = 2: the strong regime's heads alternate strong and near-zero decays.
        g = _inputs.log_decay(gen, gate, BATCH, C, 2, K)[:, :, 0]
    elif gate == "minus5":
        g = -5.0 + 0.1 * torch.rand(BATCH, C, K, generator=gen)
    else:  # mixed: every other channel near -5 a token, the rest near 0
        g = -1e-3 * torch.rand(BATCH, C, K, generator=gen)
        g[..., ::2] = -5.0 + 0.1 * torch.rand(BATCH, C, K // 2, generator=gen)
    left = torch.randn(BATCH, C, K, generator=gen)
    right = torch.randn(BATCH, C, K, generator=gen)
    return (torch.cumsum(g, dim=1).numpy(), left.numpy(), right.numpy())


@pytest.mark.parametrize("C", [64, 48, 40])
@pytest.mark.parametrize("strict", [True, False], ids=["strict", "diag"])
@pytest.mark.parametrize("gate", GATES)
def test_scores_match_broadcast_form(gate: str, strict: bool, C: int) -> None:
    """The scores in float32 agree with the float64 broadcast form element by element, at any decay."""
    G, left, right = draw(gate, C, seed=C + 2 * strict)
    got = np.asarray(_pairwise_scores(jnp.asarray(G), jnp.asarray(left), jnp.asarray(right), strict), np.float64)
    G64, l64, r64 = (x.astype(np.float64) for x in (G, left, right))
    want = broadcast_scores(G64, l64, r64, strict)
    span = np.max(np.abs(G64[..., :, None, :] - G64[..., None, :, :]), axis=-1)  # [..., C, C]
    scale = (1.0 + span) * broadcast_magnitude(G64, l64, r64, strict)
    assert np.isfinite(got).all()
    err = np.max(np.abs(got - want) / (scale + FLOOR / BOUND))
    assert err < BOUND, f"{gate} C={C} strict={strict}: max scaled error {err:.2e}"
    fro = np.linalg.norm(got - want) / np.linalg.norm(want)
    assert fro < FRO_BOUND, f"{gate} C={C} strict={strict}: relative Frobenius error {fro:.2e}"
    # Masking exactly as before: zeros above the diagonal (and on it when strict).
    assert not np.triu(got, k=0 if strict else 1).any()
    if gate == "minus5":
        # The case is as hard as claimed: the true decays within a chunk reach far below float32's range
        # (exp(-103) is its smallest subnormal; ~exp(-310) = 1e-135 at C = 64).
        assert (G64[:, -1] - G64[:, 0]).max() < -4.9 * (C - 1)


@pytest.mark.parametrize("strict", [True, False], ids=["strict", "diag"])
@pytest.mark.parametrize("gate", ["typical", "strong", "mixed"])
def test_gradients_match_broadcast_form(gate: str, strict: bool) -> None:
    """The gradients (w.r.t. G, left, right) agree with those of the broadcast form in float64."""
    C = 40  # padded to whole sub-blocks: the padding's gradient must vanish too
    G, left, right = draw(gate, C, seed=7 + strict)
    dS = np.random.default_rng(11).standard_normal((BATCH, C, C)).astype(np.float32)

    def loss(G, left, right):
        return jnp.sum(_pairwise_scores(G, left, right, strict) * dS)

    got = jax.grad(loss, argnums=(0, 1, 2))(jnp.asarray(G), jnp.asarray(left), jnp.asarray(right))
    G64, l64, r64, d64 = (x.astype(np.float64) for x in (G, left, right, dS))
    C_ = np.arange(C)
    mask = (C_[:, None] > C_[None, :]) if strict else (C_[:, None] >= C_[None, :])
    decay = np.where(mask[..., None], np.exp(np.where(mask[..., None], G64[:, :, None] - G64[:, None], 0.0)), 0.0)
    term = d64[..., None] * l64[:, :, None] * decay * r64[:, None]  # [B, C(i), C(j), K]: d loss / d G_i
    want = (
        term.sum(2) - term.sum(1),
        np.einsum("bij,bijk,bjk->bik", d64, decay, r64),
        np.einsum("bij,bik,bijk->bjk", d64, l64, decay),
    )
    for name, g_got, g_want in zip(("G", "left", "right"), got, want, strict=True):
        g_got = np.asarray(g_got, np.float64)
        assert np.isfinite(g_got).all(), name
        err = np.linalg.norm(g_got - g_want) / max(np.linalg.norm(g_want), 1e-30)
        assert err < GRAD_BOUND, f"d{name} {gate} strict={strict}: relative error {err:.2e}"
