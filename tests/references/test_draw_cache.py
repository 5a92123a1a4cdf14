"""The remembered normal draws of references/_inputs.py: the same numbers and the same generator stream as drawing
anew, safe against callers that write into what they get, and bounded."""

from __future__ import annotations

import pytest
import torch

from deltabench.references import _inputs
from deltabench.references.gdn import make_inputs

SHAPE = (1, 1024, 8, 128)  # 2**20 numbers: the smallest draw remembered


@pytest.fixture(autouse=True)
def _empty_cache() -> None:
    _inputs._draws.clear()


def _fresh(seed: int, *shape: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A draw and the next one, from a new generator, without the cache."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen), torch.randn(3, generator=gen)


def test_a_remembered_draw_is_the_same_numbers_and_leaves_the_stream_where_a_new_draw_would() -> None:
    expected, expected_next = _fresh(5, *SHAPE)
    for _ in range(2):  # a miss, then a hit
        gen = _inputs.generator(5)
        assert torch.equal(_inputs.randn(gen, *SHAPE), expected)
        assert torch.equal(torch.randn(3, generator=gen), expected_next)
    assert len(_inputs._draws) == 1


def test_small_draws_and_other_states_are_not_confused() -> None:
    a = _inputs.randn(_inputs.generator(1), *SHAPE)
    b = _inputs.randn(_inputs.generator(2), *SHAPE)
    assert not torch.equal(a, b)
    gen = _inputs.generator(1)
    _inputs.randn(gen, 4)  # a small draw moves the stream: the large one after it is another draw
    assert not torch.equal(_inputs.randn(gen, *SHAPE), a)
    assert len(_inputs._draws) == 3


def test_writing_into_a_draw_does_not_change_the_next_one() -> None:
    first = _inputs.randn(_inputs.generator(3), *SHAPE)
    kept = first.clone()
    first.zero_()
    again = _inputs.randn(_inputs.generator(3), *SHAPE)
    assert torch.equal(again, kept)
    again.zero_()
    assert torch.equal(_inputs.randn(_inputs.generator(3), *SHAPE), kept)


def test_the_cache_keeps_to_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    one = torch.Size(SHAPE).numel() * 4
    monkeypatch.setattr(_inputs, "DRAW_CACHE_BYTES", 2 * one)
    for seed in range(4):
        _inputs.randn(_inputs.generator(seed), *SHAPE)
    assert len(_inputs._draws) == 2  # the two most recent


@pytest.mark.parametrize("regime", ["typical", "long", "strong"])
@pytest.mark.parametrize("unit_qk", [True, False])
def test_an_ops_inputs_are_the_same_with_the_cache_cold_warm_and_off(
    regime: str, unit_qk: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    dims = {"B": 1, "T": 1024, "H": 8, "K": 128, "V": 128}
    draw = {"seed": 11, "regime": regime, "initial_state": True, "unit_qk": unit_qk}
    cold = make_inputs(**dims, **draw)
    assert _inputs._draws  # q, k and v were large enough to be remembered
    warm = make_inputs(**dims, **draw)
    monkeypatch.setattr(_inputs, "DRAW_CACHE_MIN_NUMEL", 1 << 40)
    off = make_inputs(**dims, **draw)
    for other in (warm, off):
        assert cold.keys() == other.keys() and all(torch.equal(cold[n], other[n]) for n in cold)
