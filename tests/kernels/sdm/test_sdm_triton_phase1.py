"""Phase 1 of deltabench's Triton SDM (kernels/sdm/triton/) under TRITON_INTERPRET=1, at tiny shapes: the decay
backward's block skip and the replay's Z-only Gram kernel give the bits of the kernels that do all the work, over
seeds, shapes and regimes (the strong one and key-weighted decay among them); Phase 1 by slot runs (PHASE1 = "sort",
kernels/sdm/triton/phase1_sorted.py) against the all-pairs kernels on adversarial slot patterns, and the op through
it against the float64 oracle, bitwise repeatable, its replay with the forward's bits."""

from __future__ import annotations

import pytest
import torch
from test_sdm_torch import errors, run_with_grads

from deltabench.kernels.sdm.triton import triton_chunk as fwd_module
from deltabench.kernels.sdm.triton import triton_chunk_bwd as bwd_module
from deltabench.kernels.sdm.triton.triton_chunk import sdm_triton_chunk
from deltabench.references.sdm import make_inputs, sdm_recurrent

# (B, T, H, S, D, W, R, C, regime, seed): sparse slots (most blocks skipped), collisions, key-weighted, strong
BIT_CASES = [
    (1, 19, 2, 64, 3, 3, 2, 16, "typical", 0),
    (1, 21, 1, 10, 3, 4, 3, 8, "collisions", 1),
    (2, 13, 1, 40, 2, 3, 3, 16, "key_weighted", 2),
    (1, 60, 1, 8, 2, 4, 2, 64, "strong", 3),  # one chunk of 64, 4 padding tokens
]
BOUND = 1e-5  # float32 against float64, as in test_sdm_triton_chunk.py
BIT_IDS = [f"T{c[1]}-H{c[2]}-S{c[3]}-W{c[5]}-R{c[6]}-C{c[7]}-{c[8]}" for c in BIT_CASES]


def _same_bits(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> list[str]:
    """The names whose tensors differ in any bit (-0 against +0 included)."""
    return [n for n in a if not torch.equal(a[n].view(torch.int32), b[n].view(torch.int32))]


class _NoSkip:
    """decay_bwd_kernel launched with SKIP=False: every block summed, as before the skip."""

    def __init__(self, kernel) -> None:
        self.kernel = kernel

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.kernel[grid](*args, SKIP=False, **kwargs)


@pytest.mark.parametrize("B,T,H,S,D,W,R,C,regime,seed", BIT_CASES, ids=BIT_IDS)
def test_decay_bwd_block_skip_keeps_the_bits(
    B: int, T: int, H: int, S: int, D: int, W: int, R: int, C: int, regime: str, seed: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """Every gradient of a call with decay_bwd's block skip equals, bit for bit, that of one summing every block."""
    x = make_inputs(B, T, H, S, D, W, R, seed=seed, regime=regime, initial_bank=True)
    skipped = run_with_grads(sdm_triton_chunk, x, torch.float32, chunk_size=C)
    monkeypatch.setattr(bwd_module, "decay_bwd_kernel", _NoSkip(bwd_module.decay_bwd_kernel))
    summed = run_with_grads(sdm_triton_chunk, x, torch.float32, chunk_size=C)
    assert skipped.keys() == summed.keys() and not _same_bits(skipped, summed)


def test_decay_bwd_block_skip_keeps_signed_zeros() -> None:
    """A row whose every sum is zero keeps the sign SKIP=False gives it: -0 in the slot total becomes +0 at the
    first block summed, skipped or not (slots far apart: every block but the row's own is skipped)."""
    E, P, W, R = 96, 64, 3, 2
    gen = torch.Generator().manual_seed(4)
    s_w = torch.randperm(1000, generator=gen)[:E].view(1, E)
    s_r = torch.randperm(1000, generator=gen)[:P].view(1, P) + 1000  # reads meet no write
    dL_w = torch.zeros(1, E)
    dL_r = torch.randn(1, P, generator=gen)
    dtot = torch.randn(1, E, generator=gen)
    dtot[0, ::3] = -0.0
    outs = []
    for skip in (True, False):
        dld = torch.empty(1, E)
        bwd_module.decay_bwd_kernel[(1, E // 32)](s_w, s_r, dL_w, dL_r, dtot, dld, E, P, W, R, 32, 32, SKIP=skip)
        outs.append(dld)
    assert torch.equal(outs[0].view(torch.int32), outs[1].view(torch.int32))
    assert not torch.equal(outs[0].view(torch.int32), dtot.view(torch.int32))  # the -0s did become +0


@pytest.mark.parametrize("B,T,H,S,D,W,R,C,regime,seed", BIT_CASES, ids=BIT_IDS)
def test_replay_z_only_gram_gives_the_forward_z(
    B: int, T: int, H: int, S: int, D: int, W: int, R: int, C: int, regime: str, seed: int
) -> None:
    """The Gram kernel without A and QK (the backward's replay) writes the bits of the forward's Z, for all chunks
    and for a segment of them, and leaves A and QK untouched."""
    x = make_inputs(B, T, H, S, D, W, R, seed=seed, regime=regime, initial_bank=True)
    S_ = x.pop("num_slots")
    kw = x.pop("key_weighted_decay")
    args = [x[n] for n in ("k_idx", "k_val", "q_idx", "q_val", "v", "g", "beta", "initial_bank")]
    _, _, sv = fwd_module._forward(*args, kw, S_, C, save=True)
    assert sv is not None and sv.Z is not None and sv.segment == sv.s_w.shape[1]
    BH, N, E = sv.s_w.shape
    for c0, n in ((0, N), (N - 1, 1)):
        Z = torch.full((BH, n, E, C), float("nan"))
        untouched = torch.full((BH, n, C, C), 7.0)
        fwd_module._gram(sv.s_w, sv.kv, sv.L_w, sv.L_tot, sv.s_r, sv.qv, sv.L_r, untouched, untouched, Z, c0, aqk=False)
        assert torch.equal(Z.view(torch.int32), sv.Z[:, c0 : c0 + n].contiguous().view(torch.int32))
        assert bool((untouched == 7.0).all())


# ------------------------------------------------------------------------------- Phase 1 by slot runs (PHASE1 "sort")


def _slots(kind: str, x: dict, seed: int) -> None:
    """Rewrites x's slots into an adversarial pattern for the slot runs (in place)."""
    B, T, H, W = x["k_idx"].shape
    R = x["q_idx"].shape[-1]
    gen = torch.Generator().manual_seed(seed)
    if kind == "one_slot":  # every write and read entry on slot 0: one run of all the chunk's entries
        x["k_idx"].zero_()
        x["q_idx"].zero_()
    elif kind == "own_slots":  # every write entry alone on its slot; reads of them (earlier tokens, other chunks)
        own = torch.randperm(x["num_slots"], generator=gen)[: B * T * H * W].view(B, T, H, W)
        x["k_idx"] = own
        x["q_idx"] = own.flatten(1, 3)[:, torch.randint(0, T * H * W, (T * H * R,), generator=gen)].view(B, T, H, R)
    elif kind == "repeats":  # a slot written twice within a token (decayed once)
        x["k_idx"][..., W - 1] = x["k_idx"][..., 0]
    elif kind == "own_token_reads":  # each token reads the slots it writes itself
        x["q_idx"] = x["k_idx"][..., torch.arange(R) % W].clone()


# (T, H, S, W, R, C, regime, slots): T ragged (padding tokens) in every case
RUN_CASES = [
    (11, 1, 10, 3, 2, 8, "collisions", "one_slot"),
    (21, 2, 512, 3, 2, 8, "typical", "own_slots"),
    (19, 1, 10, 3, 3, 8, "key_weighted", "repeats"),
    (13, 1, 12, 3, 3, 8, "collisions", "own_token_reads"),
    (60, 1, 8, 4, 2, 64, "strong", "none"),
]
RUN_IDS = [f"{c[7]}-{c[6]}-T{c[0]}-C{c[5]}" for c in RUN_CASES]
PHASE1_OUT = ("L_w", "L_tot", "L_r", "first", "A", "QK", "Z")


def _phase1(x: dict, C: int, mode: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, torch.Tensor]:
    """Phase 1's outputs of the forward with PHASE1 = `mode` (Phase 2's steps left out: they change none of them)."""
    monkeypatch.setattr(fwd_module, "PHASE1", mode)
    monkeypatch.setattr(fwd_module, "_step", lambda *args, **kwargs: None)
    args = [x[n] for n in ("k_idx", "k_val", "q_idx", "q_val", "v", "g", "beta", "initial_bank")]
    _, _, sv = fwd_module._forward(*args, x["key_weighted_decay"], x["num_slots"], C, save=True)
    assert sv is not None
    return {n: getattr(sv, n) for n in PHASE1_OUT}


@pytest.mark.parametrize("T,H,S,W,R,C,regime,slots", RUN_CASES, ids=RUN_IDS)
def test_phase1_by_slot_runs_matches_all_pairs(
    T: int, H: int, S: int, W: int, R: int, C: int, regime: str, slots: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The slot runs' decays, first flags, A, QK and Z against the all-pairs kernels': the flags equal, the rest
    equal to float32 rounding (the sums run in another order), on adversarial slot patterns."""
    x = make_inputs(1, T, H, S, 3, W, R, seed=T, regime=regime, initial_bank=True)
    _slots(slots, x, T)
    pairs = _phase1(x, C, "pairs", monkeypatch)
    runs = _phase1(x, C, "sort", monkeypatch)
    assert torch.equal(pairs["first"], runs["first"])
    for n in PHASE1_OUT[:3] + PHASE1_OUT[4:]:
        ref = pairs[n]
        torch.testing.assert_close(runs[n], ref, rtol=1e-5, atol=1e-6 * float(ref.abs().max()), msg=n)


# (B, T, H, S, D, W, R, C, regime, repeats): y, the bank and every gradient against the float64 oracle
RUN_GRAD_CASES = [
    (1, 19, 3, 16, 4, 3, 2, 8, "collisions", False),  # ragged (8, 8, 3), odd H
    (2, 5, 1, 12, 3, 2, 3, 8, "key_weighted", True),  # T inside one chunk, a slot written twice a token
]
RUN_GRAD_IDS = [f"B{c[0]}-T{c[1]}-H{c[2]}-C{c[7]}-{c[8]}{'-repeats' * c[9]}" for c in RUN_GRAD_CASES]


@pytest.mark.parametrize("B,T,H,S,D,W,R,C,regime,repeats", RUN_GRAD_CASES, ids=RUN_GRAD_IDS)
def test_phase1_by_slot_runs_against_the_oracle(
    B: int, T: int, H: int, S: int, D: int, W: int, R: int, C: int, regime: str, repeats: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """With Phase 1 by slot runs, y, the final bank and every gradient against the float64 oracle, and two calls
    give the same bits."""
    monkeypatch.setattr(fwd_module, "PHASE1", "sort")
    x = make_inputs(B, T, H, S, D, W, R, seed=T, regime=regime, initial_bank=True)
    if repeats:
        _slots("repeats", x, T)
    ref = run_with_grads(sdm_recurrent, x, torch.float64, allow_repeated_writes=repeats)
    ours = run_with_grads(sdm_triton_chunk, x, torch.float32, chunk_size=C, allow_repeated_writes=repeats)
    errs = errors(ours, ref)
    assert max(errs.values()) < BOUND, errs
    again = run_with_grads(sdm_triton_chunk, x, torch.float32, chunk_size=C, allow_repeated_writes=repeats)
    assert not _same_bits(ours, again)


def test_phase1_by_slot_runs_replays_with_the_forward_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    """With Phase 1 by slot runs, a backward replaying segments of one chunk (Z from the runs, A and QK not made)
    gives every gradient bit for bit as one that kept the rows."""
    monkeypatch.setattr(fwd_module, "PHASE1", "sort")
    x = make_inputs(1, 19, 2, 10, 4, 3, 2, seed=7, regime="collisions", initial_bank=True)
    kept = run_with_grads(sdm_triton_chunk, x, torch.float32, chunk_size=8)
    monkeypatch.setattr(fwd_module, "replay_segment", lambda *dims: 1)
    replayed = run_with_grads(sdm_triton_chunk, x, torch.float32, chunk_size=8)
    assert kept.keys() == replayed.keys() and not _same_bits(kept, replayed)
