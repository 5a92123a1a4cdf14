"""deltabench's PyTorch SDM (kernels/sdm: token loop, chunked WY form, decode step) against the float64 oracle.

y, the final bank and every gradient (k_val, q_val, v, g, beta, initial_bank) with random cotangents on both
outputs; T below, at and past a chunk multiple; H = 3; every regime (typical, collision-heavy, long memory,
key-weighted decay). Then the chunk-size invariance, the decay-once rule, the dense limit (sdm == gdn) and mutants
that each check must reject.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from deltabench.kernels.sdm import sdm_decode_step, sdm_torch_chunk, sdm_torch_recurrent
from deltabench.kernels.sdm.torch import torch_chunk as chunk_module
from deltabench.kernels.sdm.torch import torch_recurrent as recurrent_module
from deltabench.references import gdn
from deltabench.references.sdm import SDM_REGIMES, make_inputs, sdm_recurrent

FLOATS = ("k_val", "q_val", "v", "g", "beta", "initial_bank")
BOUND = 1e-5  # float32 against float64 at these sizes measures 1e-7 .. 2e-6 (relative Frobenius error)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    err = (x.double() - ref.double()).norm()
    return (err / ref.norm() if ref.norm() > 0 else err).item()


def run_with_grads(fn: Callable[..., tuple[torch.Tensor, torch.Tensor]], x: dict, dtype: torch.dtype, **kw: object):
    """``fn(**x)`` with the float inputs cast to `dtype` and made leaves; backward of random cotangents on y and the
    final bank (seeded, the same for every fn). Returns ``{"y", "final_bank", "grad:<input>"...}``."""
    leaves = {n: (t.to(dtype) if n in FLOATS else t) for n, t in x.items()}
    for n in FLOATS:
        if n in leaves:
            leaves[n] = leaves[n].detach().clone().requires_grad_(True)
    y, bank = fn(**leaves, **kw)
    gen = torch.Generator().manual_seed(99)
    dy = torch.randn(y.shape, generator=gen, dtype=torch.float64)
    dbank = torch.randn(bank.shape, generator=gen, dtype=torch.float64) * 0.1
    ((y.double() * dy).sum() + (bank.double() * dbank).sum()).backward()
    out = {"y": y.detach(), "final_bank": bank.detach()}
    out.update({f"grad:{n}": leaves[n].grad for n in FLOATS if n in leaves})
    return out


def errors(ours: dict, ref: dict) -> dict[str, float]:
    return {name: _rel(ours[name], ref[name]) for name in ref}


CASES = [  # (B, T, H, S, D, W, R, C, regime, initial_bank)
    (1, 37, 3, 24, 5, 4, 3, 16, "typical", True),  # ragged last chunk
    (2, 32, 3, 24, 6, 4, 3, 16, "collisions", True),  # T at a chunk multiple
    (1, 9, 3, 16, 4, 3, 5, 16, "long", False),  # T inside one chunk
    (1, 40, 1, 32, 7, 5, 2, 16, "key_weighted", True),
    (2, 21, 3, 12, 3, 6, 6, 8, "collisions", False),  # W = R = S / 2: every slot in every chunk
    (1, 33, 2, 20, 4, 2, 4, 32, "key_weighted", False),
]
IDS = [f"B{c[0]}-T{c[1]}-H{c[2]}-S{c[3]}-D{c[4]}-W{c[5]}-R{c[6]}-C{c[7]}-{c[8]}-h0{int(c[9])}" for c in CASES]


@pytest.mark.parametrize("B,T,H,S,D,W,R,C,regime,h0", CASES, ids=IDS)
def test_torch_impls_match_oracle(
    B: int, T: int, H: int, S: int, D: int, W: int, R: int, C: int, regime: str, h0: bool
) -> None:
    """Token loop and chunked form agree with the float64 oracle on y, the final bank and every gradient."""
    x = make_inputs(B, T, H, S, D, W, R, seed=T + S, regime=regime, initial_bank=h0)
    ref = run_with_grads(sdm_recurrent, x, torch.float64)
    for fn, kw in ((sdm_torch_recurrent, {}), (sdm_torch_chunk, {"chunk_size": C})):
        ours = run_with_grads(fn, x, torch.float32, **kw)
        assert ours["y"].dtype == torch.float32 and ours["final_bank"].shape == (B, H, S, D)
        errs = errors(ours, ref)
        assert all(e < BOUND for e in errs.values()), (fn.__name__, errs)


def test_bf16_inputs_keep_a_float32_bank() -> None:
    """bf16 inputs: y comes back in bf16, the bank in float32, both close to the oracle on the same rounded inputs."""
    x = make_inputs(1, 30, 2, 24, 8, 4, 4, seed=3, dtype=torch.bfloat16, initial_bank=True)
    ry, rbank = sdm_recurrent(**x)
    y, bank = sdm_torch_chunk(**x, chunk_size=16)
    assert y.dtype == torch.bfloat16 and bank.dtype == torch.float32
    assert _rel(y, ry) < 1e-2 and _rel(bank, rbank) < 1e-5


@pytest.mark.parametrize("regime", SDM_REGIMES)
def test_chunk_size_invariance(regime: str) -> None:
    """C = 16, 64 and 128 agree to float32 rounding (every output and gradient), T = 150 ragged for all three."""
    x = make_inputs(1, 150, 2, 40, 4, 4, 3, seed=5, regime=regime, initial_bank=True)
    runs = {C: run_with_grads(sdm_torch_chunk, x, torch.float32, chunk_size=C) for C in (16, 64, 128)}
    for C in (64, 128):
        errs = errors(runs[C], runs[16])
        assert all(e < BOUND for e in errs.values()), (C, errs)


def test_checkpointed_segments_change_no_bit(monkeypatch: pytest.MonkeyPatch) -> None:
    """The backward through checkpointed segments of chunks gives the same bits as autograd over all chunks at
    once (one segment of every chunk), on every output and gradient, ragged T, collisions, with an initial bank."""
    x = make_inputs(1, 70, 3, 16, 4, 3, 2, seed=4, regime="collisions", initial_bank=True)
    segmented = run_with_grads(sdm_torch_chunk, x, torch.float32, chunk_size=8)  # 9 chunks: segments of 3
    monkeypatch.setattr(chunk_module, "segment_chunks", lambda n: max(n, 1))
    whole = run_with_grads(sdm_torch_chunk, x, torch.float32, chunk_size=8)
    assert segmented.keys() == whole.keys() and all(torch.equal(segmented[n], whole[n]) for n in whole)


def _banks_held(x: dict, monkeypatch: pytest.MonkeyPatch, segment_chunks: Callable[[int], int] | None) -> float:
    """The storage autograd keeps for the backward of ``sdm_torch_chunk(**x)`` (C = 8), in banks."""
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    leaves = {n: (t.clone().requires_grad_(True) if n in FLOATS else t) for n, t in x.items()}
    with monkeypatch.context() as mp:
        if segment_chunks is not None:
            mp.setattr(chunk_module, "segment_chunks", segment_chunks)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            sdm_torch_chunk(**leaves, chunk_size=8)
    return sum(storages.values()) / (x["initial_bank"].numel() * 4)


def test_autograd_holds_about_sqrt_n_banks(monkeypatch: pytest.MonkeyPatch) -> None:
    """What autograd keeps after the forward: the banks at segment starts, ~sqrt(N), where autograd over all
    chunks at once keeps every chunk's gathered rows and pair tensors: 64 chunks here, 8 and change against ~27
    (it grows with N, the segments' with sqrt(N))."""
    x = make_inputs(1, 512, 2, 1024, 32, 4, 4, seed=1, initial_bank=True)
    whole = _banks_held(x, monkeypatch, lambda n: max(n, 1))
    segmented = _banks_held(x, monkeypatch, None)
    assert whole >= 24 and segmented <= 9, (whole, segmented)


def test_repeated_slot_decays_once_per_token() -> None:
    """A slot written by every token of a chunk (and twice within a token, where allowed) is decayed once per
    token: the chunked form matches the oracle with the decay-once rule, collision-heavy inputs included."""
    x = make_inputs(1, 24, 2, 6, 4, 4, 3, seed=8, regime="collisions", initial_bank=True)
    ref = run_with_grads(sdm_recurrent, x, torch.float64)
    errs = errors(run_with_grads(sdm_torch_chunk, x, torch.float32, chunk_size=8), ref)
    assert all(e < BOUND for e in errs.values()), errs
    # Repeats within a token (SDM 2.0.0 decays the slot once, with its first entry's decay).
    x = make_inputs(1, 20, 2, 8, 4, 4, 3, seed=9, regime="key_weighted", initial_bank=True)
    x["k_idx"][:, :, :, 1] = x["k_idx"][:, :, :, 0]
    ref = run_with_grads(sdm_recurrent, x, torch.float64, allow_repeated_writes=True)
    for fn, kw in ((sdm_torch_recurrent, {}), (sdm_torch_chunk, {"chunk_size": 8})):
        errs = errors(run_with_grads(fn, x, torch.float32, allow_repeated_writes=True, **kw), ref)
        assert all(e < BOUND for e in errs.values()), (fn.__name__, errs)


def test_decode_step_is_one_token_of_the_op() -> None:
    """Repeated decode steps reproduce the oracle's y and bank, token after token, and the gradients."""
    x = make_inputs(2, 6, 3, 16, 5, 3, 4, seed=4, regime="key_weighted", initial_bank=True)
    ry, rbank = sdm_recurrent(**x)
    bank = x["initial_bank"]
    for t in range(6):
        step = {n: x[n][:, t] for n in ("k_idx", "k_val", "q_idx", "q_val", "v", "g", "beta")}
        y, bank = sdm_decode_step(**step, bank=bank, key_weighted_decay=True)
        assert _rel(y, ry[:, t]) < BOUND
    assert _rel(bank, rbank) < BOUND


def dense_limit_inputs(B: int, T: int, H: int, K: int, V: int, regime: str) -> tuple[dict, dict]:
    """gdn inputs and the sdm inputs that compute the same: one factor of width K, S = W = R = K, every token
    writing and reading all K slots in order with weights k_t and scale * q_t, no key-weighted decay."""
    x = gdn.make_inputs(B, T, H, K, V, dtype=torch.float64, seed=21, regime=regime, initial_state=True)
    slots = torch.arange(K).expand(B, T, H, K)
    s = {"k_idx": slots, "k_val": x["k"], "q_idx": slots, "q_val": x["q"] * K**-0.5, "v": x["v"], "g": x["g"]}
    s.update(beta=x["beta"], initial_bank=x["initial_state"])
    return x, s


@pytest.mark.parametrize("regime", ["typical", "long"])
def test_dense_limit_is_gdn(regime: str) -> None:
    """With S = W = R = d_k and identity slot sets, sdm (oracle, token loop and chunked) computes gdn's oracle."""
    x, s = dense_limit_inputs(2, 45, 3, 8, 6, regime)
    o, state = gdn.gdn_recurrent(**x)
    y, bank = sdm_recurrent(**s)
    torch.testing.assert_close(y, o, rtol=0, atol=1e-12)
    torch.testing.assert_close(bank, state, rtol=0, atol=1e-12)
    for fn, kw in ((sdm_torch_recurrent, {}), (sdm_torch_chunk, {"chunk_size": 16})):
        y, bank = fn(**{n: (t.float() if t.is_floating_point() else t) for n, t in s.items()}, **kw)
        assert _rel(y, o) < BOUND and _rel(bank, state) < BOUND, fn.__name__


@pytest.mark.parametrize("bad", ["no-decay-of-repeats", "decay-per-entry", "read-before-write"])
def test_mutants_are_rejected(bad: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each planted bug in the chunked form breaks the oracle comparison on collision-heavy inputs: a slot decayed
    twice (the chunk's decay applied once per write of the slot), a slot not decayed by its earlier writes, a read
    that misses the decay its own token gave the slot."""
    real = chunk_module._chunk_slot_decays

    def mutant(slot_w: torch.Tensor, ld: torch.Tensor, slot_r: torch.Tensor, C: int):
        L_w, L_r, L_tot = real(slot_w, ld, slot_r, C)
        if bad == "no-decay-of-repeats":  # every write sees only its own token's decay
            return ld, L_r, ld
        if bad == "decay-per-entry":  # the chunk's decay applied again for each write of the slot
            count = (slot_w[..., :, None] == slot_w[..., None, :]).sum(-1)
            return L_w, L_r, L_tot * count
        # read-before-write: a read misses the decay (and so the state) its own token gave the slot
        own = (slot_r[..., :, None] == slot_w[..., None, :]) & (
            torch.arange(slot_r.shape[-1])[:, None] // (slot_r.shape[-1] // C)
            == torch.arange(slot_w.shape[-1])[None, :] // (slot_w.shape[-1] // C)
        )
        return L_w, L_r - (own * ld[..., None, :]).sum(-1), L_tot

    monkeypatch.setattr(chunk_module, "_chunk_slot_decays", mutant)
    x = make_inputs(1, 24, 2, 8, 4, 4, 3, seed=8, regime="collisions", initial_bank=True)
    ry, rbank = sdm_recurrent(**x)
    y, bank = sdm_torch_chunk(**x, chunk_size=8)
    assert max(_rel(y, ry), _rel(bank, rbank)) > 1e-2


def test_read_before_write_mutant_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    """A token loop whose read sees the bank before its own token's decay and write fails the oracle comparison."""
    real = recurrent_module.sdm_step

    def read_first(bank: torch.Tensor, k_idx: torch.Tensor, k_val: torch.Tensor, q_idx: torch.Tensor, *rest):
        _, new_bank = real(bank, k_idx, k_val, q_idx, *rest)
        q_val, v, g, *tail = rest
        y, _ = real(bank, k_idx, k_val * 0, q_idx, q_val, v, g * 0, *tail)  # the bank before decay and write
        return y, new_bank

    monkeypatch.setattr(recurrent_module, "sdm_step", read_first)
    x = make_inputs(1, 12, 2, 8, 4, 4, 3, seed=8, regime="collisions", initial_bank=True)
    ry, rbank = sdm_recurrent(**x)
    y, bank = sdm_torch_recurrent(**x)
    assert _rel(bank, rbank) < BOUND and _rel(y, ry) > 1e-2


def test_backward_sums_repeated_gathers_in_a_fixed_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """The chunked reference's backward adds the gradients of repeated gathers (a bank row several entries read, a
    slot's decay total all its entries read) with PyTorch's deterministic algorithms on, the caller's setting
    restored after: on a GPU the default scatter-add sums them atomically, in no fixed order, and the gate's
    bitwise determinism check fails. Asserted at the scatter-adds themselves; the gradients still match the
    plain gathers' bit for bit here (the CPU adds in order either way)."""
    modes: list[bool] = []
    scatter_add_ = torch.Tensor.scatter_add_

    def spy(self: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        modes.append(torch.are_deterministic_algorithms_enabled())
        return scatter_add_(self, *args, **kwargs)

    x = make_inputs(1, 40, 2, 16, 4, 3, 2, seed=7, regime="collisions", initial_bank=True)
    plain = run_with_grads(sdm_torch_chunk, x, torch.float32, chunk_size=8)
    monkeypatch.setattr(torch.Tensor, "scatter_add_", spy)
    ordered = run_with_grads(sdm_torch_chunk, x, torch.float32, chunk_size=8)
    assert len(modes) >= 3 and all(modes), modes
    assert not torch.are_deterministic_algorithms_enabled()
    assert all(torch.equal(plain[n], ordered[n]) for n in plain)
