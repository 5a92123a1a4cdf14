"""The float64 SDM oracle (references/sdm.py::sdm_recurrent), which keeps only the rows a sequence touches, against
the dense token loop it replaced (kept here unchanged as ``_dense_reference``): the same outputs and final bank, bit
for bit, and the same gradients to every float input, in every regime, with and without an initial bank. Gradients
are bit for bit too where each token's write slots are distinct; where a token repeats a slot they agree to
rounding (the two graphs add that row's gradient contributions in different orders)."""

from __future__ import annotations

import sys

import pytest
import torch

from deltabench.references import sdm
from deltabench.references.sdm import check_sdm_inputs, first_write_mask

pytestmark = pytest.mark.usefixtures("one_torch_thread")

FLOATS = ("k_val", "q_val", "v", "g", "beta", "initial_bank")
# Gradients with repeated write slots: the largest difference over the largest magnitude of each gradient
# (measured: at most 2.8e-16 over these shapes, seeds and regimes).
GRAD_RTOL = 1e-14
# (B, T, H, S, D, W, R): one pair; several pairs and heads; S below W + R (reads hit written slots); a wide bank
# that the sequence leaves mostly untouched.
SHAPES = [(1, 6, 1, 8, 3, 3, 2), (2, 9, 3, 16, 4, 4, 5), (1, 12, 2, 5, 2, 4, 5), (2, 7, 2, 64, 5, 3, 2)]


def _dense_reference(
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
    """The oracle as it was: every token decays and scatters into the whole [B, H, S, D] bank."""
    B, T, H, S, D, W, R = check_sdm_inputs(
        k_idx, k_val, q_idx, q_val, v, g, beta, initial_bank, num_slots, allow_repeated_writes=allow_repeated_writes
    )
    k_val, q_val, v, g, beta = (x.to(torch.float64) for x in (k_val, q_val, v, g, beta))
    M = v.new_zeros(B, H, S, D) if initial_bank is None else initial_bank.to(torch.float64)
    k_idx, q_idx = k_idx.long(), q_idx.long()
    first = first_write_mask(k_idx)
    ys = []
    for t in range(T):
        kt, kv, qt, qv = k_idx[:, t], k_val[:, t], q_idx[:, t], q_val[:, t]  # [B, H, W|R]
        log_decay = g[:, t, :, None] * kv if key_weighted_decay else g[:, t, :, None].expand(B, H, W)
        # Each slot of the token's write set decays once: later repeats of a slot add no log-decay.
        log_decay = torch.where(first[:, t], log_decay, torch.zeros_like(log_decay))
        slot_log_decay = M.new_zeros(B, H, S).scatter_add(-1, kt, log_decay)
        M = M * slot_log_decay.exp()[..., None]
        rows = M.gather(2, kt[..., None].expand(B, H, W, D))
        u = beta[:, t, :, None] * (v[:, t] - (kv[..., None] * rows).sum(2))  # [B, H, D]
        M = M.scatter_add(2, kt[..., None].expand(B, H, W, D), kv[..., None] * u[:, :, None, :])
        ys.append((qv[..., None] * M.gather(2, qt[..., None].expand(B, H, R, D))).sum(2))
    y = torch.stack(ys, dim=1) if ys else v.new_zeros(B, 0, H, D)
    return y, M


def _inputs(shape: tuple[int, ...], seed: int, regime: str, initial_bank: bool, repeats: bool) -> dict:
    """make_inputs, every float in float64; with `repeats`, some tokens write a slot twice or three times."""
    x = sdm.make_inputs(*shape, dtype=torch.float64, seed=seed, regime=regime, initial_bank=initial_bank)
    if repeats:
        k_idx = x["k_idx"].clone()
        k_idx[:, 1::2, :, -1] = k_idx[:, 1::2, :, 0]  # odd tokens: the last entry repeats the first
        if k_idx.shape[-1] > 2:
            k_idx[:, ::3, :, 1] = k_idx[:, ::3, :, 0]  # every third token: the second too (a slot three times)
        x.update(k_idx=k_idx, allow_repeated_writes=True)
    x.update({n: x[n].double() for n in FLOATS if n in x})  # g and the initial bank are made float32
    return x


def _run(fn, x: dict, cot: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """y, the final bank and the gradient of <cot, (y, bank)> to every float input."""
    leaves = {n: x[n].detach().clone().requires_grad_() for n in FLOATS if n in x}
    y, bank = fn(**{**x, **leaves})
    loss = (y * cot[0]).sum() + (bank * cot[1]).sum()
    # Unused: an empty input (W, R or B of 0) may not reach the loss; its gradient is then zeros.
    grads = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True, materialize_grads=True)
    return (y.detach(), bank.detach(), *grads)


def _compare(x: dict, seed: int) -> float:
    """Assert the oracle equals the dense reference on `x` (bitwise; gradients to GRAD_RTOL where a token repeats
    a write slot); return the largest relative gradient difference."""
    B, T, H, D = x["v"].shape
    S = x["num_slots"]
    gen = torch.Generator().manual_seed(seed + 1000)
    cot = (torch.randn(B, T, H, D, generator=gen, dtype=torch.float64),
           torch.randn(B, H, S, D, generator=gen, dtype=torch.float64))  # fmt: skip
    got, want = _run(sdm.sdm_recurrent, x, cot), _run(_dense_reference, x, cot)
    names = ("y", "final_bank", *(n for n in FLOATS if n in x))
    worst = 0.0
    for name, a, b in zip(names, got, want, strict=True):
        assert a.dtype == b.dtype == torch.float64 and a.shape == b.shape, name
        if name in ("y", "final_bank") or not x.get("allow_repeated_writes"):
            assert torch.equal(a, b), f"{name}: max difference {(a - b).abs().max().item():.3g}"
            continue
        rel = ((a - b).abs().max() / b.abs().max().clamp_min(1e-300)).item()
        assert rel <= GRAD_RTOL, f"d/d{name}: relative difference {rel:.3g}"
        worst = max(worst, rel)
    return worst


@pytest.mark.parametrize("repeats", [False, True], ids=["distinct", "repeats"])
@pytest.mark.parametrize("initial_bank", [False, True], ids=["zero-bank", "initial-bank"])
@pytest.mark.parametrize("regime", sdm.SDM_REGIMES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}-T{}-H{}-S{}-D{}-W{}-R{}".format(*s))
def test_oracle_equals_the_dense_loop(shape, regime: str, initial_bank: bool, repeats: bool) -> None:
    for seed in (0, 1):
        _compare(_inputs(shape, seed, regime, initial_bank, repeats), seed)


@pytest.mark.parametrize("shape", [(1, 3, 2, 4, 2, 0, 2), (2, 3, 1, 4, 2, 2, 0), (0, 3, 2, 4, 2, 2, 2)])
def test_no_writes_no_reads_no_batch(shape) -> None:
    _compare(_inputs(shape, 0, "typical", True, False), 0)


def test_no_tokens_returns_the_initial_bank() -> None:
    x = _inputs((1, 0, 2, 6, 3, 2, 2), 0, "typical", True, False)
    y, bank = sdm.sdm_recurrent(**x)
    assert y.shape == (1, 0, 2, 3) and torch.equal(bank, x["initial_bank"])


def _saved_bytes(fn, x: dict) -> int:
    """Bytes of the distinct storages autograd keeps for the backward of one call of `fn`."""
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    leaves = {n: x[n].detach().clone().requires_grad_() for n in FLOATS}
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(**{**x, **leaves})
    return sum(storages.values())


def test_backward_keeps_the_touched_rows_not_the_bank() -> None:
    """At S far above T (W + R): what the oracle keeps for the backward is under one bank; the dense loop's, about
    two banks a token."""
    x = _inputs((1, 16, 2, 4096, 4, 3, 2), 0, "typical", True, True)
    bank = x["initial_bank"].numel() * 8
    assert _saved_bytes(sdm.sdm_recurrent, x) < bank / 4
    assert _saved_bytes(_dense_reference, x) > 16 * bank


def test_the_comparison_catches_a_repeated_slot_decayed_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted in the reference: every entry counts as its slot's first, so a slot written twice decays twice."""
    monkeypatch.setattr(sys.modules[__name__], "first_write_mask", lambda k_idx: torch.ones_like(k_idx, dtype=bool))
    x = _inputs(SHAPES[1], 0, "typical", True, True)
    with pytest.raises(AssertionError, match="max difference"):
        _compare(x, 0)
