"""The float64 SDM oracles (references/sdm.py): finite-difference gradients, the one-line errors, the input
generator's regimes, and product-key top-k's selection rule on hand-worked ties."""

from __future__ import annotations

import pytest
import torch

from deltabench.references import sdm

pytestmark = pytest.mark.usefixtures("one_torch_thread")


FLOATS = ("k_val", "q_val", "v", "g", "beta", "initial_bank")


@pytest.mark.parametrize("regime", ["typical", "key_weighted"])
def test_oracle_gradients_match_finite_differences(regime: str) -> None:
    """gradcheck every float input (initial bank included), both outputs, at a tiny shape with collisions."""
    x = sdm.make_inputs(1, 5, 2, 6, 3, 3, 2, dtype=torch.float64, seed=3, regime=regime, initial_bank=True)
    x["k_idx"][:, 1:] = x["k_idx"][:, :1]  # every token writes the same slots: decays compound across tokens
    floats = {n: x[n].detach().double().requires_grad_() for n in FLOATS}

    def oracle(*tensors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return sdm.sdm_recurrent(**{**x, **dict(zip(FLOATS, tensors, strict=True))})

    assert torch.autograd.gradcheck(oracle, tuple(floats.values()), eps=1e-6, atol=1e-8, rtol=1e-6)


def test_decay_once_when_a_token_repeats_a_slot() -> None:
    """allow_repeated_writes: a slot written twice by one token decays once; both entries read and write it."""
    M0 = torch.tensor([[[[2.0], [5.0]]]], dtype=torch.float64)  # [B=1, H=1, S=2, D=1]
    k_idx = torch.tensor([[[[0, 0]]]])
    k_val = torch.tensor([[[[1.0, 0.5]]]], dtype=torch.float64)
    g, beta = torch.full((1, 1, 1), -1.0, dtype=torch.float64), torch.full((1, 1, 1), 0.5, dtype=torch.float64)
    args = (k_idx, k_val, torch.tensor([[[[0]]]]), torch.ones(1, 1, 1, 1, dtype=torch.float64))
    y, M = sdm.sdm_recurrent(*args, torch.ones(1, 1, 1, 1), g, beta, M0, allow_repeated_writes=True)
    decayed = 2.0 * torch.e**-1
    u = 0.5 * (1.0 - 1.5 * decayed)
    assert torch.allclose(M[0, 0, :, 0], torch.tensor([decayed + 1.5 * u, 5.0], dtype=torch.float64))
    assert torch.allclose(y[0, 0, 0], M[0, 0, 0])


def _tiny() -> dict:
    return sdm.make_inputs(1, 4, 2, 8, 3, 3, 2, seed=1)


@pytest.mark.parametrize(
    "edit,message",
    [
        (lambda x: x["k_idx"].__setitem__((0, 2, 1, 0), 8), r"k_idx holds slot 8 outside \[0, 8\)"),
        (lambda x: x["q_idx"].__setitem__((0, 1, 0, 1), -1), r"q_idx holds slot -1 outside \[0, 8\)"),
        (lambda x: x["k_idx"].__setitem__((0, 3, 1, 2), int(x["k_idx"][0, 3, 1, 0])), "repeats write slot"),
        (lambda x: x.update(num_slots=2), "selects 3 slots per token, more than the bank's S=2"),
        (lambda x: x.update(num_slots=None), "pass num_slots or initial_bank"),
        (lambda x: x.update(g=x["g"][:, :3]), r"g must be \[B, T, H\]"),
        (lambda x: x.update(k_idx=x["k_idx"].float()), "k_idx must be an int64"),
        # typical draws signed write weights: under the key-weighted decay a negative one would grow its slot
        (lambda x: x.update(key_weighted_decay=True), r"key_weighted_decay needs k_val >= 0"),
    ],
    ids=["k-out-of-range", "q-negative", "repeated-write", "W>S", "no-S", "bad-shape", "float-index", "kw-negative"],
)
def test_bad_input_is_one_line_value_error(edit, message: str) -> None:
    x = _tiny()
    edit(x)
    with pytest.raises(ValueError, match=message) as err:
        sdm.sdm_recurrent(**x)
    assert "\n" not in str(err.value)


def test_factors_must_multiply_to_S() -> None:
    assert sdm.check_factors([4, 8], 32) == (4, 8)
    with pytest.raises(ValueError, match=r"address 30 slots, not S=32"):
        sdm.check_factors([5, 6], 32)
    with pytest.raises(ValueError, match="positive widths"):
        sdm.check_factors([4, 0])


def test_generator_is_seeded_and_regimes_differ() -> None:
    """Same seed, same tensors; collisions hit at most W + W/2 + 1 slots; key_weighted sets its flag and k_val >= 0;
    write slots are distinct within each token in every regime."""
    a, b = sdm.make_inputs(2, 7, 3, 64, 4, 4, 3, seed=1), sdm.make_inputs(2, 7, 3, 64, 4, 4, 3, seed=1)
    assert all(torch.equal(a[n], b[n]) for n in a if isinstance(a[n], torch.Tensor))
    c = sdm.make_inputs(2, 7, 3, 64, 4, 4, 3, seed=2)
    assert not torch.equal(a["k_idx"], c["k_idx"]) and not torch.equal(a["v"], c["v"])
    hot = sdm.make_inputs(1, 64, 2, 64, 4, 8, 8, seed=1, regime="collisions")
    assert hot["k_idx"].unique().numel() <= 13
    kw = sdm.make_inputs(1, 8, 2, 64, 4, 8, 8, seed=1, regime="key_weighted")
    assert kw["key_weighted_decay"] is True and bool((kw["k_val"] >= 0).all())
    for regime in sdm.SDM_REGIMES:
        x = sdm.make_inputs(1, 16, 2, 32, 4, 8, 4, seed=3, regime=regime)
        assert (x["k_idx"].sort(-1).values.diff(dim=-1) > 0).all()
        assert x["k_idx"].dtype == torch.int64 and x["g"].dtype == torch.float32 and bool((x["g"] <= 0).all())


def test_contract_lists_dims_inputs_and_gradients() -> None:
    c = sdm.CONTRACT
    assert c.dims == ("B", "T", "H", "S", "D", "W", "R")
    assert [a.name for a in c.inputs][:7] == ["k_idx", "k_val", "q_idx", "q_val", "v", "g", "beta"]
    assert c.grad_inputs == ("k_val", "q_val", "v", "g", "beta", "initial_bank")
    assert {a.name: a.dtype for a in c.inputs}["k_idx"] == "index"


# --- product-key top-k -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("factors,k", [((8, 8), 5), ((6, 7), 20), ((3, 4, 5), 9), ((50,), 7), ((2, 2, 2, 3), 12)])
def test_pk_topk_is_an_exact_top_k(factors: tuple[int, ...], k: int) -> None:
    """On random rows the selected scores are the k largest of all S brute-force sums (F <= 2: no partial
    rounding, so the float32 sums are the scores), indices ascending."""
    raw = torch.randn(7, sum(factors), generator=torch.Generator().manual_seed(k))
    val, idx = sdm.pk_topk(raw, factors, k)
    parts = raw.split(factors, dim=-1)
    full = parts[0]
    for p in parts[1:]:
        full = (full[..., :, None] + p[..., None, :]).flatten(-2)  # float32, in factor order
    best = full.topk(min(k, full.shape[-1]), dim=-1).values
    assert torch.equal(val.float().sort(-1, descending=True).values, best)
    assert torch.equal(full.gather(-1, idx), val.float())
    assert bool((idx.diff(dim=-1) > 0).all())


@pytest.mark.parametrize(
    "raw,factors,k,expected",
    [
        ([1.0, 1.0, 0.0], (2, 1), 1, [1]),  # equal factor values: the larger column first
        ([2.0, 1.0, -9.0, 1.0, 0.0, -9.0], (3, 3), 2, [0, 3]),  # (0,1) ties (1,0): same i+j, the larger i
        ([2.0, 1.0, 0.5, 1.0, 0.5, 0.0], (3, 3), 3, [0, 1, 2]),  # (0,2) ties (1,0): the larger i+j wins
        ([0.0, -0.0, -1.0], (3,), 1, [0]),  # -0 < +0
        ([float("nan"), -float("inf"), -5.0], (3,), 2, [1, 2]),  # NaN counts as -inf; the tie to the larger column
        ([1.0, 1.0, 0.0, 0.0], (2, 2), 1, [3]),  # only (0, 0) is a candidate at k = 1: columns (1, 1)
    ],
    ids=["factor-tie", "larger-i", "larger-i+j", "signed-zero", "nan", "k1-candidates"],
)
def test_pk_topk_tie_rule(raw: list[float], factors: tuple[int, ...], k: int, expected: list[int]) -> None:
    _, idx = sdm.pk_topk(torch.tensor([raw]), factors, k)
    assert idx[0].tolist() == expected
