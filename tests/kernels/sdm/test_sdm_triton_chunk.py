"""deltabench's Triton SDM (kernels/sdm/triton/triton_chunk.py and triton_chunk_bwd.py) under TRITON_INTERPRET=1, at
tiny shapes (the interpreter runs every program in Python): y and the final bank against the float64 oracle with a
ragged last chunk, T inside one chunk, colliding slots, key-weighted decay, repeated write slots and the dense limit
(gdn); every gradient against the float64 oracle's autograd in every regime; bitwise the same across two calls
(forward and backward) and in a fresh process; planted bugs in the backward rejected; bad input refused before any
launch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_sdm_torch import errors, run_with_grads

from deltabench.kernels.sdm.triton import triton_chunk_bwd as bwd_module
from deltabench.kernels.sdm.triton.triton_chunk import sdm_triton_chunk
from deltabench.references import gdn
from deltabench.references.sdm import make_inputs, sdm_recurrent

BOUND = 1e-5  # float32 against float64: these cases measure 1e-7 .. 5e-7 (relative Frobenius error)
CASES = [  # (B, T, H, S, D, W, R, C, regime, initial_bank)
    (1, 19, 2, 16, 4, 3, 2, 8, "collisions", True),  # ragged: chunks of 8, 8, 3
    (2, 5, 1, 12, 3, 2, 3, 8, "key_weighted", False),  # T inside one chunk
    (1, 16, 1, 20, 5, 4, 4, 8, "typical", True),  # T at a chunk multiple
    (1, 70, 2, 8, 4, 4, 2, 64, "strong", True),  # a slot's log-decay in a chunk of 64 far past float32's exp range
]
IDS = [f"B{c[0]}-T{c[1]}-H{c[2]}-S{c[3]}-D{c[4]}-W{c[5]}-R{c[6]}-C{c[7]}-{c[8]}-h0{int(c[9])}" for c in CASES]


def _rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x.double() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("B,T,H,S,D,W,R,C,regime,h0", CASES, ids=IDS)
def test_forward_matches_oracle(
    B: int, T: int, H: int, S: int, D: int, W: int, R: int, C: int, regime: str, h0: bool
) -> None:
    x = make_inputs(B, T, H, S, D, W, R, seed=T, regime=regime, initial_bank=h0)
    ry, rbank = sdm_recurrent(**x)
    y, bank = sdm_triton_chunk(**x, chunk_size=C)
    assert y.shape == (B, T, H, D) and y.dtype == torch.float32 and bank.shape == (B, H, S, D)
    assert _rel(y, ry) < BOUND and _rel(bank, rbank) < BOUND, (_rel(y, ry), _rel(bank, rbank))


def test_sparse_chunks_whose_blocks_share_no_slot() -> None:
    """A bank much larger than a chunk's entries (as at the flagship shape), where most of the Gram kernel's blocks
    of write entries share no slot with a token and are skipped: every token writes slots of its own, and reads
    slots that earlier tokens wrote (its chunk's and the previous ones'), so that what each read sees comes only
    from blocks with a read match and no write match. y, the bank and every gradient against the oracle."""
    T, W, R, C = 45, 8, 4, 16  # E = 128 write entries a chunk: four blocks of 32
    x = make_inputs(1, T, 1, 4096, 4, W, R, seed=11, initial_bank=True)
    gen = torch.Generator().manual_seed(11)
    own = torch.randperm(4096, generator=gen)[: T * W].view(1, T, 1, W)  # no slot written by two tokens
    x["k_idx"] = own
    earlier = torch.stack([torch.randint(0, t + 1, (R,), generator=gen) for t in range(T)])  # [T, R] tokens <= t
    which = torch.randint(0, W, (T, R), generator=gen)
    x["q_idx"] = own[0, :, 0][earlier, which].view(1, T, 1, R)
    ref = run_with_grads(sdm_recurrent, x, torch.float64)
    errs = errors(run_with_grads(sdm_triton_chunk, x, torch.float32, chunk_size=C), ref)
    assert max(errs.values()) < BOUND, errs


def test_bitwise_deterministic_and_repeats_decay_once() -> None:
    """Two calls give the same bits; a slot repeated within a token (allowed) decays once, as in the oracle; the
    initial bank is left as it was."""
    x = make_inputs(1, 11, 1, 10, 4, 3, 2, seed=2, regime="collisions", initial_bank=True)
    x["k_idx"][:, :, :, 2] = x["k_idx"][:, :, :, 0]
    bank0 = x["initial_bank"].clone()
    first = sdm_triton_chunk(**x, chunk_size=8, allow_repeated_writes=True)
    second = sdm_triton_chunk(**x, chunk_size=8, allow_repeated_writes=True)
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
    assert torch.equal(x["initial_bank"], bank0)
    ry, rbank = sdm_recurrent(**x, allow_repeated_writes=True)
    assert _rel(first[0], ry) < BOUND and _rel(first[1], rbank) < BOUND


def test_dense_limit_is_gdn() -> None:
    """S = W = R = d_k, every token writing and reading all slots with weights k and scale * q: gdn's oracle."""
    B, T, H, K, V = 1, 12, 1, 8, 4
    x = gdn.make_inputs(B, T, H, K, V, seed=4, initial_state=True)
    slots = torch.arange(K).expand(B, T, H, K)
    o, state = gdn.gdn_recurrent(**x)
    y, bank = sdm_triton_chunk(
        slots, x["k"], slots, x["q"] * K**-0.5, x["v"], x["g"], x["beta"], x["initial_state"], chunk_size=8
    )
    assert _rel(y, o) < BOUND and _rel(bank, state) < BOUND


_FRESH_PROCESS = """
import sys, torch
sys.path.insert(0, sys.argv[2])
from deltabench.kernels.sdm.triton.triton_chunk import sdm_triton_chunk
from deltabench.references.sdm import make_inputs
from test_sdm_torch import run_with_grads
x = make_inputs(1, 13, 2, 12, 4, 3, 2, seed=6, regime="key_weighted", initial_bank=True)
torch.save(run_with_grads(sdm_triton_chunk, x, torch.float32, chunk_size=8), sys.argv[1])
"""


def test_bitwise_the_same_in_a_fresh_process(tmp_path: Path) -> None:
    """Another Python process computes the same bits as this one: outputs and every gradient."""
    out = tmp_path / "fresh.pt"
    here_dir = str(Path(__file__).parent)
    subprocess.run([sys.executable, "-c", _FRESH_PROCESS, str(out), here_dir], check=True, timeout=300)
    x = make_inputs(1, 13, 2, 12, 4, 3, 2, seed=6, regime="key_weighted", initial_bank=True)
    here = run_with_grads(sdm_triton_chunk, x, torch.float32, chunk_size=8)
    there = torch.load(out)
    assert here.keys() == there.keys() and all(torch.equal(here[n], there[n]) for n in here)


@pytest.mark.parametrize(
    "edit,message",
    [
        (lambda x: x["k_idx"].__setitem__((0, 1, 0, 0), 99), "outside"),
        (lambda x: x["k_idx"].__setitem__((0, 1, 0, 1), int(x["k_idx"][0, 1, 0, 0])), "repeats write slot"),
        (lambda x: x.update(chunk_size=0), "chunk_size must be"),
        # the draw's write weights are signed: the contract holds the key-weighted decay to k_val >= 0
        (lambda x: x.update(key_weighted_decay=True), r"key_weighted_decay needs k_val >= 0"),
    ],
    ids=["out-of-range", "repeated", "chunk-size", "kw-negative"],
)
def test_bad_input_is_refused(edit, message: str) -> None:
    x = make_inputs(1, 4, 1, 8, 2, 2, 2, seed=1)
    x["chunk_size"] = 8
    edit(x)
    with pytest.raises(ValueError, match=message):
        sdm_triton_chunk(**x)


GRAD_CASES = [  # (B, T, H, S, D, W, R, C, regime, initial_bank)
    (1, 19, 3, 16, 4, 3, 2, 8, "collisions", True),  # ragged (8, 8, 3), odd H
    (1, 16, 1, 20, 5, 4, 4, 8, "typical", False),  # T at a chunk multiple
    (2, 5, 1, 12, 3, 2, 3, 8, "key_weighted", True),  # T inside one chunk
    (1, 21, 1, 16, 40, 3, 3, 8, "long", True),  # D = 40: two column slices in the reverse walk
    (1, 13, 3, 10, 4, 3, 2, 8, "key_weighted", False),  # ragged, odd H
    (1, 12, 1, 6, 4, 3, 3, 4, "collisions", False),  # W = R = S / 2: every slot in every chunk
    (1, 70, 2, 8, 4, 4, 2, 64, "strong", False),  # strong decays accumulated over a chunk of 64
]
GRAD_IDS = [f"B{c[0]}-T{c[1]}-H{c[2]}-S{c[3]}-D{c[4]}-W{c[5]}-R{c[6]}-C{c[7]}-{c[8]}-h0{int(c[9])}" for c in GRAD_CASES]


@pytest.mark.parametrize("B,T,H,S,D,W,R,C,regime,h0", GRAD_CASES, ids=GRAD_IDS)
def test_gradients_match_oracle(
    B: int, T: int, H: int, S: int, D: int, W: int, R: int, C: int, regime: str, h0: bool
) -> None:
    """y, the final bank and the gradient of every float input (random cotangents on both outputs) against the
    float64 oracle's autograd."""
    x = make_inputs(B, T, H, S, D, W, R, seed=T + S, regime=regime, initial_bank=h0)
    ref = run_with_grads(sdm_recurrent, x, torch.float64)
    ours = run_with_grads(sdm_triton_chunk, x, torch.float32, chunk_size=C)
    assert set(ours) == set(ref) and all(ours[n] is not None for n in ref)
    errs = errors(ours, ref)
    assert all(e < BOUND for e in errs.values()), errs


def test_gradients_bitwise_deterministic_and_repeats() -> None:
    """Two backward passes give the same bits for every gradient; a write slot repeated within a token (allowed)
    gets the oracle's gradients (the repeat has no decay of its own)."""
    x = make_inputs(1, 11, 3, 10, 4, 3, 2, seed=2, regime="key_weighted", initial_bank=True)
    x["k_idx"][:, :, :, 2] = x["k_idx"][:, :, :, 0]
    first = run_with_grads(sdm_triton_chunk, x, torch.float32, chunk_size=8, allow_repeated_writes=True)
    second = run_with_grads(sdm_triton_chunk, x, torch.float32, chunk_size=8, allow_repeated_writes=True)
    assert first.keys() == second.keys() and all(torch.equal(first[n], second[n]) for n in first)
    ref = run_with_grads(sdm_recurrent, x, torch.float64, allow_repeated_writes=True)
    errs = errors(first, ref)
    assert all(e < BOUND for e in errs.values()), errs


def test_no_gradient_needed_keeps_nothing() -> None:
    """Without inputs that require a gradient the outputs carry none (the forward keeps no rows)."""
    x = make_inputs(1, 9, 1, 8, 4, 2, 2, seed=3, initial_bank=True)
    y, bank = sdm_triton_chunk(**x, chunk_size=8)
    assert not y.requires_grad and not bank.requires_grad


@pytest.mark.parametrize("segment", [1, 2])
def test_a_replayed_backward_gives_the_bits_of_one_that_kept_the_rows(
    segment: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the forward keeps a bank per segment instead of every chunk's rows, the backward replays each segment's
    steps from its bank: every gradient bit for bit as when the rows were kept (3 chunks: segments of 1 and 2, the
    last one short)."""
    from deltabench.kernels.sdm.triton import triton_chunk as fwd_module

    x = make_inputs(1, 19, 2, 10, 4, 3, 2, seed=7, regime="collisions", initial_bank=True)
    kept = run_with_grads(sdm_triton_chunk, x, torch.float32, chunk_size=8)
    replays: list[tuple[int, int]] = []
    replay = fwd_module._replay

    def counted(sv, c0: int, c1: int):
        replays.append((c0, c1))
        return replay(sv, c0, c1)

    monkeypatch.setattr(fwd_module, "replay_segment", lambda *dims: segment)
    monkeypatch.setattr(fwd_module, "_replay", counted)
    replayed = run_with_grads(sdm_triton_chunk, x, torch.float32, chunk_size=8)
    assert replays == ([(2, 3), (1, 2), (0, 1)] if segment == 1 else [(2, 3), (0, 2)])
    assert kept.keys() == replayed.keys() and all(torch.equal(kept[n], replayed[n]) for n in kept)


def test_the_replay_is_taken_where_it_at_least_halves_the_memory() -> None:
    """The flagship op (BH = 2, S = 65536, D = 1024, W = R = 64, C = 64): segments of 32 chunks at 8K tokens (4 of
    8 GiB), 64 at 32K (8 of 32 GiB); small banks and short sequences keep every chunk's rows."""
    from deltabench.kernels.sdm.triton.triton_chunk import replay_segment

    E = P = 64 * 64
    assert replay_segment(128, 2, 65536, 1024, E, P) == 32
    assert replay_segment(512, 2, 65536, 1024, E, P) == 64
    assert replay_segment(3, 2, 10, 4, 24, 16) == 3
    assert replay_segment(2, 2, 65536, 1024, E, P) == 2  # two chunks: one bank costs more than their rows


@pytest.mark.parametrize("regime", ["typical", "key_weighted"])
def test_entry_groups_split_the_work_of_a_chunk(regime: str) -> None:
    """A chunk of 256 write entries with its slots' first writes all through it (S = 2048): the forward's update
    and the backward's two per-entry steps each split the chunk over several programs (8, 8 and 12 groups of 32),
    and the backward adds the groups' shares of Z^T dM. y, the bank and every gradient against the oracle; with
    the shares of all but the first group dropped, or one group's writes skipped, this fails."""
    C, W, R = 64, 4, 2
    assert bwd_module.entry_groups(C * W, 1) == 32 and bwd_module.entry_groups(C * (W + R), 1) == 32
    x = make_inputs(1, 100, 1, 2048, 4, W, R, seed=13, regime=regime, initial_bank=True)
    ref = run_with_grads(sdm_recurrent, x, torch.float64)
    errs = errors(run_with_grads(sdm_triton_chunk, x, torch.float32, chunk_size=C), ref)
    assert max(errs.values()) < BOUND, errs


class _Edited:
    """A Triton kernel whose launches apply `edit` to the launch's arguments, before or after it runs."""

    def __init__(self, kernel, edit, before: bool) -> None:
        self.kernel, self.edit, self.before = kernel, edit, before

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            if self.before:
                self.edit(args)
            self.kernel[grid](*args, **kwargs)
            if not self.before:
                self.edit(args)

        return launch


MUTANTS = {  # (kernel, edit of its arguments, before the launch)
    # The carried bank gradient misses the chunk's decay of its row (exp(L_total) taken as 1).
    "no-decay-on-carried-bank-grad": ("gather_weights_kernel", lambda args: args[8].zero_(), False),
    # The gradient through each write's share of its slot's new row (<dM[s_e], U[t_e]>) is dropped.
    "no-new-row-share": ("bwd_entries_kernel", lambda args: args[7].zero_(), False),
    # The gradient of each read's gather of the chunk-start bank (<G[t_p], M0[s_p]>) is dropped.
    "no-read-gather": ("bwd_rewrite_kernel", lambda args: args[12].zero_(), False),
    # The segmented scans' backward forgets the slot's chunk total (its decay of the slot's new row).
    "no-slot-total-in-scan": ("decay_bwd_kernel", lambda args: args[4].zero_(), True),
}


@pytest.mark.parametrize("bad", list(MUTANTS))
def test_backward_mutants_are_rejected(bad: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each planted bug in the backward moves some gradient far past the bound the real backward meets."""
    name, edit, before = MUTANTS[bad]
    monkeypatch.setattr(bwd_module, name, _Edited(getattr(bwd_module, name), edit, before))
    x = make_inputs(1, 19, 1, 10, 4, 3, 2, seed=5, regime="collisions", initial_bank=True)
    ref = run_with_grads(sdm_recurrent, x, torch.float64)
    errs = errors(run_with_grads(sdm_triton_chunk, x, torch.float32, chunk_size=8), ref)
    assert errs["y"] < BOUND and max(errs.values()) > 1e-2, errs


def test_chunk_size_invariance() -> None:
    """C = 16 and C = 64 agree to float32 rounding (y, the final bank and every gradient) on collision-heavy inputs,
    T = 70 ragged for both (the harness calls the kernel at its default C = 64)."""
    x = make_inputs(1, 70, 1, 16, 4, 2, 2, seed=3, regime="collisions", initial_bank=True)
    runs = {C: run_with_grads(sdm_triton_chunk, x, torch.float32, chunk_size=C) for C in (16, 64)}
    errs = errors(runs[64], runs[16])
    assert all(e < BOUND for e in errs.values()), errs
