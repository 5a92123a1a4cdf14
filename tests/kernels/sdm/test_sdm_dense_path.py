"""sdm's Triton impl at its dense limit (W = S, kernels/sdm/triton/dense.py) under TRITON_INTERPRET=1: the op run as
the gated delta rule through deltabench's GDN Triton kernels, against the float64 oracle on y, the final bank and
every gradient, with write slots in a shuffled order per token and read slots that repeat (their weights add);
bitwise the same across two calls; taken exactly where it applies (key-weighted decay and W < S stay sparse)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from deltabench.kernels.sdm.triton import dense as dense_module
from deltabench.kernels.sdm.triton import triton_chunk as chunk_module
from deltabench.kernels.sdm.triton.triton_chunk import sdm_triton_chunk
from deltabench.references.sdm import make_inputs, sdm_recurrent
from test_sdm_torch import errors, run_with_grads

BOUND = {torch.float32: 1e-5, torch.bfloat16: 3e-2}  # fp32: GDN's kernels measure ~1e-7 here; bf16: their rounding


def _dense_inputs(B: int, T: int, H: int, S: int, D: int, *, seed: int, h0: bool) -> dict:
    """Inputs with W = R = S: the write slots a random permutation per token, the read slots drawn with repeats."""
    x = make_inputs(B, T, H, S, D, S, S, seed=seed, regime="typical", initial_bank=h0)
    gen = torch.Generator().manual_seed(seed)
    x["k_idx"] = torch.argsort(torch.rand(B, T, H, S, generator=gen), dim=-1)
    x["q_idx"] = torch.randint(0, S, (B, T, H, S), generator=gen)
    return x


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(("T", "h0"), [(70, True), (64, False), (5, True)], ids=["ragged", "chunk-multiple", "short"])
def test_dense_limit_matches_the_oracle(T: int, h0: bool, dtype: torch.dtype) -> None:
    x = _dense_inputs(1, T, 3, 16, 8, seed=T, h0=h0)
    ref = run_with_grads(sdm_recurrent, x, torch.float64)
    ours = run_with_grads(sdm_triton_chunk, x, dtype)
    assert ours["y"].dtype == dtype and ours["final_bank"].dtype == torch.float32
    errs = errors(ours, ref)
    assert max(errs.values()) < BOUND[dtype], errs


def test_dense_limit_is_bitwise_reproducible() -> None:
    x = _dense_inputs(1, 40, 2, 16, 8, seed=3, h0=True)
    first = run_with_grads(sdm_triton_chunk, x, torch.float32)
    second = run_with_grads(sdm_triton_chunk, x, torch.float32)
    assert all(torch.equal(first[n], second[n]) for n in first)


@pytest.mark.parametrize(
    ("W", "regime", "dense"), [(16, "typical", True), (16, "key_weighted", False), (8, "typical", False)]
)
def test_taken_exactly_at_the_dense_limit(W: int, regime: str, dense: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    taken = []

    def spy(*args, **kwargs):  # the real dense path, recorded
        taken.append(True)
        return dense_module.sdm_dense_gdn(*args, **kwargs)

    monkeypatch.setattr(chunk_module, "sdm_dense_gdn", spy)
    x = make_inputs(1, 9, 1, 16, 4, W, 4, seed=1, regime=regime, initial_bank=True)
    y, bank = sdm_triton_chunk(**x, chunk_size=8)
    ry, rbank = sdm_recurrent(**x)
    assert bool(taken) == dense
    assert ((y.double() - ry).norm() / ry.norm()).item() < 1e-5
    assert ((bank.double() - rbank).norm() / rbank.norm()).item() < 1e-5


def _set(name: str, where: tuple[int, ...], value) -> Callable[[dict], None]:
    """An edit of one index of an input, the value a number or a function of the inputs."""
    return lambda x: x[name].__setitem__(where, value(x) if callable(value) else value)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (_set("k_idx", (0, 6, 1, 3), 16), r"k_idx holds slot 16 outside \[0, 16\) at index \(0, 6, 1, 3\)"),
        (_set("k_idx", (0, 2, 0, 0), -1), r"k_idx holds slot -1 outside \[0, 16\)"),
        (_set("q_idx", (0, 8, 1, 5), 40), r"q_idx holds slot 40 outside \[0, 16\) at index \(0, 8, 1, 5\)"),
        (_set("k_idx", (0, 4, 0, 1), lambda x: int(x["k_idx"][0, 4, 0, 0])), r"k_idx repeats write slot"),
    ],
    ids=["write-slot-past-S", "negative-write-slot", "read-slot-past-S", "repeated-write-slot"],
)
def test_dense_path_refuses_bad_slots(edit: Callable[[dict], None], message: str) -> None:
    """The slot checks the dense path makes on the device, beside its densification: each bad index raises the
    references' one-line error (and the call takes the dense path, so these are that path's checks)."""
    x = _dense_inputs(1, 9, 2, 16, 4, seed=5, h0=True)
    assert dense_module.takes_dense_path(
        x["k_val"], x["q_val"], x["v"], 16, key_weighted_decay=False, allow_repeated_writes=False
    )
    edit(x)
    with pytest.raises(ValueError, match=message):
        sdm_triton_chunk(**x)
