"""The backward's pair work of deltabench's Triton SDM by slot runs (kernels/sdm/triton/phase1_sorted_bwd.py, used
when triton_chunk.PHASE1 = "sort") under TRITON_INTERPRET=1, at tiny shapes: each run kernel against the all-pairs
kernel it stands for on the same inputs, and every gradient of the op against the all-pairs path's at float32
rounding and against the float64 oracle, on adversarial slot patterns (every entry on one slot, every write on a
slot of its own, runs crossing chunk boundaries, repeats, a token reading its own writes) with T ragged, at a chunk
multiple and inside one chunk; bitwise repeatable; the all-pairs kernels not launched; a run cut in the backward
alone caught."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import triton
from test_sdm_torch import errors, run_with_grads
from test_sdm_triton_chunk import _Edited
from test_sdm_triton_phase1 import _same_bits, _slots

from deltabench.kernels.sdm.triton import phase1_sorted_bwd as runs_bwd
from deltabench.kernels.sdm.triton import triton_chunk as fwd_module
from deltabench.kernels.sdm.triton import triton_chunk_bwd as bwd_module
from deltabench.kernels.sdm.triton.phase1_sorted import Runs
from deltabench.kernels.sdm.triton.triton_chunk import sdm_triton_chunk
from deltabench.references.sdm import make_inputs, sdm_recurrent

BOUND = 1e-5  # float32 against float64, as in test_sdm_triton_chunk.py
PAIR_KERNELS = ("gather_weights_kernel", "gram_bwd_kernel", "decay_bwd_kernel")


def _pattern(kind: str, x: dict, seed: int) -> None:
    """Rewrites x's slots into an adversarial pattern (in place): test_sdm_triton_phase1's, and "crossing": tokens
    t and t + 1 for odd t write the same W slots and read from them, so that with even chunk sizes a run spans the
    last token of a chunk and the first of the next (two runs, one per chunk, each of the chunk's own entries)."""
    if kind != "crossing":
        _slots(kind, x, seed)
        return
    B, T, H, W = x["k_idx"].shape
    R = x["q_idx"].shape[-1]
    pair = (torch.arange(T) + 1) // 2  # tokens 2i - 1 and 2i share slots: 7 and 8 across a chunk of 8
    slots = (pair[:, None] * W + torch.arange(W)) % x["num_slots"]
    x["k_idx"] = slots.view(1, T, 1, W).expand(B, T, H, W).contiguous()
    x["q_idx"] = slots[:, torch.arange(R) % W].view(1, T, 1, R).expand(B, T, H, R).contiguous()


def _repeats(kind: str) -> bool:
    """Whether the pattern writes a slot twice within a token (every entry on one slot does too)."""
    return kind in ("one_slot", "repeats")


def _saved(x: dict, C: int, monkeypatch: pytest.MonkeyPatch) -> bwd_module.Saved:
    """The forward's saved tensors with Phase 1 by slot runs (its runs among them)."""
    monkeypatch.setattr(fwd_module, "PHASE1", "sort")
    args = [x[n] for n in ("k_idx", "k_val", "q_idx", "q_val", "v", "g", "beta", "initial_bank")]
    _, _, sv = fwd_module._forward(*args, x["key_weighted_decay"], x["num_slots"], C, save=True)
    assert sv is not None and isinstance(sv.runs, Runs)
    return sv


def _close(ours: torch.Tensor, ref: torch.Tensor, name: str) -> None:
    """Equal at float32 rounding: the bounds of test_sdm_triton_phase1's Phase 1 comparison."""
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6 * float(ref.abs().max()), msg=name)


# (T, H, S, W, R, C, regime, slots): the run kernels alone against the all-pairs kernels, on the same inputs
KERNEL_CASES = [
    (11, 1, 10, 3, 2, 8, "collisions", "one_slot"),  # ragged (8, 3)
    (21, 2, 512, 3, 2, 8, "typical", "own_slots"),  # ragged (8, 8, 5), every write alone on its slot
    (19, 1, 10, 3, 3, 8, "key_weighted", "repeats"),
    (13, 1, 12, 3, 3, 8, "collisions", "own_token_reads"),
    (16, 1, 64, 3, 2, 8, "typical", "crossing"),  # at a chunk multiple
    (60, 1, 8, 4, 2, 64, "strong", "none"),  # one chunk of 64, 4 padding tokens
]
KERNEL_IDS = [f"{c[7]}-{c[6]}-T{c[0]}-C{c[5]}" for c in KERNEL_CASES]


@pytest.mark.parametrize("T,H,S,W,R,C,regime,slots", KERNEL_CASES, ids=KERNEL_IDS)
def test_run_kernels_match_the_all_pairs_kernels(
    T: int, H: int, S: int, W: int, R: int, C: int, regime: str, slots: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On one forward's saved tensors and random upstream gradients: gram_bwd, decay_bwd (on gram_bwd's outputs)
    and every chunk's gather weights by runs against the all-pairs kernels at float32 rounding; each slot of a
    chunk has exactly one gradient-row writer among its entries in both, and the writers' rows agree."""
    x = make_inputs(1, T, H, S, 3, W, R, seed=T, regime=regime, initial_bank=True)
    _pattern(slots, x, T)
    sv = _saved(x, C, monkeypatch)
    runs = sv.runs
    assert isinstance(runs, Runs)
    BH, N, E = sv.s_w.shape
    P = sv.s_r.shape[-1]
    gen = torch.Generator().manual_seed(T)
    dA, dQK = (torch.randn(BH, N, C, C, generator=gen) for _ in range(2))
    h, mdm, dcw = (torch.randn(BH, N, E, generator=gen) for _ in range(3))
    dcr = torch.randn(BH, N, P, generator=gen)
    ins = (sv.kv, sv.L_w, sv.L_tot)
    outs = {}
    for mode in ("pairs", "runs"):
        dkv, dL_w, dtot, dld = (torch.empty_like(sv.kv) for _ in range(4))
        dqv, dL_r = torch.empty_like(sv.qv), torch.empty_like(sv.qv)
        grads = (dkv, dL_w, dtot, dqv, dL_r)
        if mode == "pairs":
            bwd_module.gram_bwd_kernel[(BH * N, triton.cdiv(E + P, 32))](
                sv.s_w, *ins, sv.s_r, sv.qv, sv.L_r, dA, dQK, h, mdm, dcw, dcr, *grads, C, E, P, W, R, 32, 32
            )
            bwd_module.decay_bwd_kernel[(BH * N, triton.cdiv(E, 32))](
                sv.s_w, sv.s_r, dL_w, dL_r, dtot, dld, E, P, W, R, 32, 32
            )
        else:
            grid = (BH * N, triton.cdiv(E + P, runs_bwd.RUN_BLOCK))
            runs_bwd.run_gram_bwd_kernel[grid](
                runs.order, runs.start, runs.end, *ins, sv.qv, sv.L_r, dA, dQK, h, mdm, dcw, dcr, *grads,
                C, E, P, W, R, runs_bwd.RUN_BLOCK,
            )  # fmt: skip
            runs_bwd.run_decay_bwd_kernel[grid](
                runs.order, runs.start, runs.end, dL_w, dL_r, dtot, dld, E, P, W, R, runs_bwd.RUN_BLOCK
            )
        outs[mode] = dict(zip(("dkv", "dL_w", "dtot", "dqv", "dL_r", "dld"), (*grads, dld), strict=True))
    for name, ref in outs["pairs"].items():
        if name != "dld":
            _close(outs["runs"][name], ref, name)
    # dld sums up to a run's length of log-decay gradients that cancel (the strong case: terms ~1, sums ~1e-4), so
    # its rounding is bounded by the sum of the terms' magnitudes, not by the result's: that sum is decay_bwd on
    # the magnitudes, and the two orders may differ by 1e-5 of it (the rtol above).
    mags = [outs["pairs"][n].abs() for n in ("dL_w", "dL_r", "dtot")]
    bound = torch.empty_like(sv.kv)
    bwd_module.decay_bwd_kernel[(BH * N, triton.cdiv(E, 32))](sv.s_w, sv.s_r, *mags, bound, E, P, W, R, 32, 32)
    diff = (outs["runs"]["dld"] - outs["pairs"]["dld"]).abs()
    assert bool((diff <= 1e-5 * bound).all()), float((diff / bound.clamp_min(1e-30)).max())
    slot_of = torch.cat([sv.s_w, sv.s_r], -1)  # [BH, N, E + P]: each entry id's slot
    for chunk in range(N):
        got = {}
        for mode in ("pairs", "runs"):
            rep = torch.empty(BH, E + P, dtype=torch.int32)
            ltot = torch.empty(BH, E + P)
            Gk, Gq = torch.empty(2, BH, E + P, C)
            if mode == "pairs":
                bwd_module.gather_weights_kernel[(BH, triton.cdiv(E + P, 32))](
                    sv.s_w, sv.kv, sv.L_w, sv.ld, sv.s_r, sv.qv, sv.L_r, rep, ltot, Gk, Gq, chunk, N,
                    C, E, P, W, R, 32, 32, bwd_module._pow2(C),
                )  # fmt: skip
            else:
                runs_bwd.run_gather_weights_kernel[(BH, triton.cdiv(E + P, runs_bwd.RUN_BLOCK))](
                    runs.order, runs.start, runs.end, sv.kv, sv.L_w, sv.ld, sv.qv, sv.L_r, rep, ltot, Gk, Gq,
                    chunk, N, C, E, P, W, R, runs_bwd.RUN_BLOCK, bwd_module._pow2(C),
                )  # fmt: skip
            got[mode] = (rep, ltot, Gk, Gq)
            for b in range(BH):
                slots = slot_of[b, chunk]
                writers = slots[rep[b] != 0]
                assert sorted(writers.tolist()) == sorted(set(slots.tolist())), (mode, chunk, b)
        for k, name in enumerate(("ltot", "Gk", "Gq")):
            _close(got["runs"][k + 1], got["pairs"][k + 1], f"{name} chunk {chunk}")


# (B, T, H, S, D, W, R, C, regime, slots): every gradient, Phase 1 by runs against all pairs and the oracle
GRAD_CASES = [
    (1, 11, 1, 10, 3, 3, 2, 8, "collisions", "one_slot"),  # ragged (8, 3)
    (1, 21, 2, 512, 3, 3, 2, 8, "typical", "own_slots"),
    (1, 19, 1, 10, 3, 3, 3, 8, "key_weighted", "repeats"),
    (1, 13, 1, 12, 3, 3, 3, 8, "collisions", "own_token_reads"),
    (2, 24, 1, 64, 3, 3, 2, 8, "typical", "crossing"),  # at a chunk multiple, runs across both boundaries
    (1, 7, 3, 40, 5, 3, 2, 8, "long", "crossing"),  # inside one chunk, odd H, D != W
    (1, 60, 1, 8, 2, 4, 2, 64, "strong", "none"),
]
GRAD_IDS = [f"B{c[0]}-T{c[1]}-H{c[2]}-C{c[7]}-{c[8]}-{c[9]}" for c in GRAD_CASES]


def _grads(x: dict, C: int, mode: str, slots: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, torch.Tensor]:
    """y, the final bank and every gradient of the op with PHASE1 = `mode`."""
    monkeypatch.setattr(fwd_module, "PHASE1", mode)
    return run_with_grads(sdm_triton_chunk, x, torch.float32, chunk_size=C, allow_repeated_writes=_repeats(slots))


@pytest.mark.parametrize("B,T,H,S,D,W,R,C,regime,slots", GRAD_CASES, ids=GRAD_IDS)
def test_every_gradient_by_runs_matches_all_pairs(
    B: int, T: int, H: int, S: int, D: int, W: int, R: int, C: int, regime: str, slots: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """With Phase 1 and its backward by slot runs, y, the final bank and every gradient equal the all-pairs path's
    at float32 rounding and are within the oracle's bound; a second call gives the same bits."""
    x = make_inputs(B, T, H, S, D, W, R, seed=T + S, regime=regime, initial_bank=True)
    _pattern(slots, x, T)
    pairs = _grads(x, C, "pairs", slots, monkeypatch)
    runs = _grads(x, C, "sort", slots, monkeypatch)
    assert pairs.keys() == runs.keys()
    for name, ref in pairs.items():
        _close(runs[name], ref, name)
    oracle = run_with_grads(sdm_recurrent, x, torch.float64, allow_repeated_writes=_repeats(slots))
    errs = errors(runs, oracle)
    assert max(errs.values()) < BOUND, errs
    assert not _same_bits(runs, _grads(x, C, "sort", slots, monkeypatch))


class _Refused:
    """Stands in for an all-pairs kernel: any launch fails the test."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __getitem__(self, grid: tuple) -> None:
        raise AssertionError(f"{self.name} launched with PHASE1 = 'sort'")


def test_sorted_backward_launches_no_all_pairs_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """With PHASE1 = "sort" the backward launches none of gather_weights, gram_bwd and decay_bwd (all pairs), in a
    call keeping the rows and in one replaying segments of one chunk."""
    x = make_inputs(1, 19, 2, 10, 4, 3, 2, seed=5, regime="collisions", initial_bank=True)
    monkeypatch.setattr(fwd_module, "PHASE1", "sort")
    for name in PAIR_KERNELS:
        monkeypatch.setattr(bwd_module, name, _Refused(name))
    kept = run_with_grads(sdm_triton_chunk, x, torch.float32, chunk_size=8)
    monkeypatch.setattr(fwd_module, "replay_segment", lambda *dims: 1)
    replayed = run_with_grads(sdm_triton_chunk, x, torch.float32, chunk_size=8)
    ref = run_with_grads(sdm_recurrent, x, torch.float64)
    assert max(errors(kept, ref).values()) < BOUND
    assert not _same_bits(kept, replayed)


def _cut_end(r: Runs) -> Runs:
    """Every run of two or more entries loses its last (the forward keeps its runs: the backward alone is cut)."""
    return dataclasses.replace(r, end=torch.maximum(r.start + 1, r.end - 1).to(torch.int32).contiguous())


def _late_start(r: Runs) -> Runs:
    """Every run of two or more entries starts one entry late for all but its first position."""
    late = torch.minimum(r.start + 1, r.end - 1)
    pos = torch.arange(r.start.shape[-1], dtype=torch.int32)
    return dataclasses.replace(r, start=torch.where(pos == r.start, r.start, late).to(torch.int32).contiguous())


@pytest.mark.parametrize("plant", [_cut_end, _late_start], ids=["cut-end", "late-start"])
def test_planted_run_bound_bug_is_caught(plant, monkeypatch: pytest.MonkeyPatch) -> None:
    """A backward walking runs with wrong bounds (the forward's runs left right) fails the comparison with the
    all-pairs path that test_every_gradient_by_runs_matches_all_pairs makes: the check can fail."""
    x = make_inputs(1, 19, 1, 10, 3, 3, 2, seed=3, regime="collisions", initial_bank=True)
    pairs = _grads(x, 8, "pairs", "none", monkeypatch)
    real = fwd_module.sdm_chunk_backward

    def planted(saved: bwd_module.Saved, *args: object, **kwargs: object) -> dict[str, torch.Tensor]:
        assert isinstance(saved.runs, Runs)
        saved.runs = plant(saved.runs)
        return real(saved, *args, **kwargs)

    monkeypatch.setattr(fwd_module, "sdm_chunk_backward", planted)
    runs = _grads(x, 8, "sort", "none", monkeypatch)
    failed = []
    for name, ref in pairs.items():
        try:
            _close(runs[name], ref, name)
        except AssertionError:
            failed.append(name)
    assert "y" not in failed and "final_bank" not in failed  # the forward's runs are right
    assert "grad:g" in failed and "grad:k_val" in failed, failed


RUN_MUTANTS = {  # (run kernel, edit of its arguments, before the launch): test_sdm_triton_chunk's MUTANTS, by runs
    # The carried bank gradient misses the chunk's decay of its row (exp(L_total) taken as 1).
    "no-decay-on-carried-bank-grad": ("run_gather_weights_kernel", lambda args: args[9].zero_(), False),
    # The gradient through each write's share of its slot's new row (<dM[s_e], U[t_e]>) is dropped.
    "no-new-row-share": ("run_gram_bwd_kernel", lambda args: args[10].zero_(), True),
    # The gradient of each read's gather of the chunk-start bank (<G[t_p], M0[s_p]>) is dropped.
    "no-read-gather": ("run_gram_bwd_kernel", lambda args: args[13].zero_(), True),
    # The segmented scans' backward forgets the slot's chunk total (its decay of the slot's new row).
    "no-slot-total-in-scan": ("run_decay_bwd_kernel", lambda args: args[5].zero_(), True),
}


@pytest.mark.parametrize("bad", list(RUN_MUTANTS))
def test_run_backward_mutants_are_rejected(bad: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each planted bug in a run kernel moves some gradient far past the oracle's bound, y untouched."""
    name, edit, before = RUN_MUTANTS[bad]
    monkeypatch.setattr(bwd_module, name, _Edited(getattr(bwd_module, name), edit, before))
    monkeypatch.setattr(fwd_module, "PHASE1", "sort")
    x = make_inputs(1, 19, 1, 10, 4, 3, 2, seed=5, regime="collisions", initial_bank=True)
    ref = run_with_grads(sdm_recurrent, x, torch.float64)
    errs = errors(run_with_grads(sdm_triton_chunk, x, torch.float32, chunk_size=8), ref)
    assert errs["y"] < BOUND and max(errs.values()) > 1e-2, errs
