"""The float64 oracles: finite-difference gradients, the reductions between ops, and the input generators."""

from __future__ import annotations

import pytest
import torch

from deltabench.references import gdn, gdn2, kda

ORACLES = {"gdn": gdn.gdn_recurrent, "gdn2": gdn2.gdn2_recurrent, "kda": kda.kda_recurrent}
GENERATORS = {"gdn": gdn.make_inputs, "gdn2": gdn2.make_inputs, "kda": kda.make_inputs}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _float64_leaves(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: x.detach().double().requires_grad_() for name, x in inputs.items()}


@pytest.mark.parametrize("with_state", [False, True], ids=["noh0", "h0"])
@pytest.mark.parametrize("op", ORACLES)
def test_oracle_gradients_match_finite_differences(op: str, with_state: bool) -> None:
    """gradcheck every input of every oracle (initial_state included) at a tiny shape, both outputs."""
    inputs = _float64_leaves(GENERATORS[op](1, 5, 2, 3, 4, seed=3, initial_state=with_state))
    names = list(inputs)

    def oracle(*tensors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return ORACLES[op](**dict(zip(names, tensors, strict=True)))

    assert torch.autograd.gradcheck(oracle, tuple(inputs.values()), eps=1e-6, atol=1e-8, rtol=1e-6)


def _assert_same(actual: tuple[torch.Tensor, torch.Tensor], expected: tuple[torch.Tensor, torch.Tensor]) -> None:
    for a, e in zip(actual, expected, strict=True):
        torch.testing.assert_close(a, e, rtol=0, atol=1e-12)


@pytest.mark.parametrize("regime", ["typical", "long", "strong"])
def test_kda_is_gdn2_with_erase_and_write_beta(regime: str) -> None:
    """kda(q, k, v, g, beta) == gdn2(q, k, v, g, b=beta, w=beta), outputs and final states."""
    B, T, H, K, V = 2, 20, 3, 5, 7
    x = kda.make_inputs(B, T, H, K, V, dtype=torch.float64, seed=11, regime=regime, initial_state=True)
    beta = x["beta"][..., None]
    expected = gdn2.gdn2_recurrent(
        x["q"], x["k"], x["v"], x["g"], beta.expand(B, T, H, K), beta.expand(B, T, H, V),
        initial_state=x["initial_state"],
    )  # fmt: skip
    _assert_same(kda.kda_recurrent(**x), expected)


@pytest.mark.parametrize("regime", ["typical", "long", "strong"])
def test_gdn_is_kda_with_decay_broadcast_over_keys(regime: str) -> None:
    """gdn(q, k, v, g, beta) == kda(q, k, v, g broadcast over K, beta), outputs and final states."""
    B, T, H, K, V = 2, 20, 3, 5, 7
    x = gdn.make_inputs(B, T, H, K, V, dtype=torch.float64, seed=12, regime=regime, initial_state=True)
    per_channel = dict(x, g=x["g"][..., None].expand(B, T, H, K))
    _assert_same(gdn.gdn_recurrent(**x), kda.kda_recurrent(**per_channel))


def test_oracles_compute_in_float64_whatever_the_input_dtype() -> None:
    """bf16 inputs give float64 outputs equal to the oracle run on the same (rounded) values in float64."""
    x = gdn2.make_inputs(1, 9, 2, 4, 6, dtype=torch.bfloat16, seed=5, initial_state=True)
    o, state = gdn2.gdn2_recurrent(**x)
    assert o.dtype == state.dtype == torch.float64
    _assert_same((o, state), gdn2.gdn2_recurrent(**{n: t.double() for n, t in x.items()}))


@pytest.mark.parametrize("op", GENERATORS)
def test_generators_are_seeded(op: str) -> None:
    """The same seed gives the same tensors; another seed gives different ones (every tensor)."""
    make = GENERATORS[op]
    first = make(2, 7, 3, 4, 5, seed=1, initial_state=True)
    again = make(2, 7, 3, 4, 5, seed=1, initial_state=True)
    other = make(2, 7, 3, 4, 5, seed=2, initial_state=True)
    assert first.keys() == again.keys() == other.keys()
    for name in first:
        assert torch.equal(first[name], again[name]), name
        assert not torch.equal(first[name], other[name]), name


@pytest.mark.parametrize("regime", ["typical", "long", "strong"])
@pytest.mark.parametrize("op", GENERATORS)
def test_generator_contract(op: str, regime: str) -> None:
    """Unit-norm q/k, log-decays <= 0 (in [-0.05, 0] for the long regime), float32 g and state, dtype honoured."""
    x = GENERATORS[op](2, 40, 3, 8, 6, dtype=torch.bfloat16, seed=4, regime=regime, initial_state=True)
    for name in ("q", "k"):
        norms = x[name].double().norm(dim=-1)
        torch.testing.assert_close(norms, torch.ones_like(norms), rtol=0, atol=1e-2)  # bf16 rounding of unit rows
    g = x["g"]
    assert g.dtype == x["initial_state"].dtype == torch.float32
    assert x["v"].dtype == torch.bfloat16
    assert (g <= 0).all()
    if regime == "long":
        assert (g >= -0.05).all()
    else:
        assert g.min() < -0.05  # logsigmoid(randn) reaches well below the long regime's range


def test_unit_norm_in_float32() -> None:
    """In float32 the q/k rows are unit-norm to rounding."""
    x = kda.make_inputs(2, 30, 3, 16, 8, seed=0)
    for name in ("q", "k"):
        norms = x[name].norm(dim=-1)
        torch.testing.assert_close(norms, torch.ones_like(norms), rtol=0, atol=1e-6)


def test_unknown_regime_is_refused() -> None:
    """A regime that does not exist raises ValueError naming the known ones."""
    with pytest.raises(ValueError, match="typical, long"):
        gdn.make_inputs(1, 4, 1, 2, 2, regime="short")


def test_strong_regime_mixes_fast_and_slow_heads() -> None:
    """Even heads forget fast (log-decay in [-5, -0.5] per token), odd heads barely decay ([-1e-3, 0])."""
    from deltabench.references import _inputs

    for per_channel, x in (
        (False, gdn.make_inputs(2, 64, 4, 8, 8, regime="strong")),
        (True, kda.make_inputs(2, 64, 4, 8, 8, regime="strong")),
    ):
        g = x["g"]
        fast, slow = g[:, :, 0::2], g[:, :, 1::2]
        assert fast.min() >= -5 and fast.max() <= -0.5 and slow.min() >= -1e-3 and slow.max() <= 0
        # over one 64-token chunk exp(-G) of a fast head overflows float32: the regime that exposes factored decays
        assert torch.isinf((-fast.sum(dim=1)).float().exp()).any(), per_channel
    assert _inputs.REGIMES == ("typical", "long", "strong")


def test_unit_qk_false_draws_norms_in_range() -> None:
    x = gdn2.make_inputs(2, 50, 3, 16, 16, unit_qk=False)
    qn, kn = x["q"].norm(dim=-1), x["k"].norm(dim=-1)
    assert qn.min() >= 0.25 - 1e-5 and qn.max() <= 2 + 1e-5 and qn.std() > 0.2
    assert kn.min() >= 0.5 - 1e-5 and kn.max() <= 1.2 + 1e-5 and kn.std() > 0.1
