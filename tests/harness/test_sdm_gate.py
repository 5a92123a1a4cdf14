"""Sparse Delta Memory (``sdm``) as a built-in op: its impls as the harness lists and gates them, the gate's
additions for it (bitwise determinism gating from the contract, the ragged last chunk through the streaming split,
colliding slots decayed once per token), planted bugs the gate rejects, bad shapes refused with exit code 2, and its
two suites (the CPU smoke suite runs; the GPU suite's jobs end ``unsupported`` on the CPU with their reason)."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from deltabench.cli.app import main
from deltabench.correctness.engine import verify_case
from deltabench.harness import registry
from deltabench.harness.cases import Case
from deltabench.harness.document import BUILTIN_OPS, ResultDocument
from deltabench.harness.ops import OPS
from deltabench.harness.suites import load_suite
from deltabench.kernels.sdm import sdm_decode_step, sdm_torch_chunk
from deltabench.kernels.sdm.torch import torch_chunk as chunk_module
from deltabench.kernels.sdm.torch import torch_recurrent as recurrent_module
from deltabench.references import sdm

# The planted chunk-by-chunk bank: the same function the bound's measurement runs (benchmarks/cpu/sdm_bank_bf16.py)
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "cpu"))
from sdm_bank_bf16 import chunk_by_chunk

# T = 128: two whole chunks of 64, so only the streaming split (63 + 65 tokens) makes a chunk ragged.
SHAPE = {"B": 1, "T": 128, "H": 2, "S": 32, "D": 8, "W": 4, "R": 4}
SMALL = "B=1,T=40,H=1,S=16,D=4,W=3,R=3"


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """Run the CLI in-process; returns (exit code, stdout, stderr)."""
    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
    out, err = capsys.readouterr()
    return int(exit_info.value.code or 0), out, err


def _gate(fn: object, *, regimes: list[str] | None = None, mode: str = "fwd", **dims: int):
    case = Case("sdm", **{**SHAPE, **dims}, dtype="fp32", mode=mode)
    return verify_case(fn, case, seeds=1, extra_seed=False, regimes=regimes)


def _failed(report) -> set[str]:  # type: ignore[no-untyped-def]
    return {r.check for r in report.failures}


# ---------------------------------------------------------------------------------------------- the op and its impls


def test_sdm_is_built_in_with_its_impls_and_the_package_adapter(capsys: pytest.CaptureFixture[str]) -> None:
    assert "sdm" in OPS and "sdm" in BUILTIN_OPS and OPS["sdm"] is sdm.CONTRACT
    assert sdm.CONTRACT.deterministic
    names = {i.name: i for i in registry.impls_for("sdm")}
    assert set(names) == {"torch_recurrent", "torch_chunk", "triton_chunk", "torch_decode", "sdm_pkg_chunk"}
    assert names["torch_decode"].modes == ("decode",) and names["torch_decode"].state_in_place
    assert names["sdm_pkg_chunk"].devices == ("cuda",) and not names["sdm_pkg_chunk"].state_grad
    assert names["triton_chunk"].backend == "triton" and set(names["triton_chunk"].devices) == {"cuda", "cpu"}
    code, out, _ = run_cli(capsys, "list", "--device", "cpu", "--json")
    assert code == 0
    listed = {(r["op"], r["impl"]) for r in json.loads(out)["impls"]}
    assert {("sdm", n) for n in names} <= listed


@pytest.mark.parametrize(
    "impl, device, message",
    [
        ("torch_recurrent", "cpu", "each token rescales the whole bank: 4,096 GiB of memory traffic per call"),
        (
            "torch_chunk",
            "cpu",
            "rewrites the whole bank 3 times and builds its pair matrices: 384 GiB of memory traffic",
        ),
        ("triton_chunk", "cpu", "the Triton interpreter takes at most 4,194,304 entry-columns"),
    ],
)
def test_flagship_shape_on_the_cpu_is_refused_with_its_figures(impl: str, device: str, message: str) -> None:
    case = Case("sdm", B=1, T=8192, H=2, S=65536, D=1024, W=64, R=64, dtype="bf16", mode="fwd+bwd", device=device)
    constraint = registry.get_impl("sdm", impl).constraint
    assert constraint is not None
    why = constraint(case)
    assert why is not None and message in why, why
    # the same shape on a GPU is not limited by these constraints, nor a smoke shape on the CPU
    assert constraint(case.replace(device="cuda")) is None
    assert constraint(Case("sdm", 1, 100, 2, 256, 32, 8, 8, device="cpu")) is None


# ------------------------------------------------------------------------------------------------ the gate for sdm


def test_torch_impls_pass_the_gate_with_determinism_gating() -> None:
    for name in ("torch_recurrent", "torch_chunk"):
        report = _gate(registry.get_impl("sdm", name), mode="fwd+bwd", T=70)
        assert report.passed, (name, [f"{r.check} {r.regime} {r.detail}" for r in report.failures])
        (det,) = [r for r in report.records if r.check == "determinism"]
        assert det.gating and det.passed and det.detail == "bitwise identical"
        assert {r.regime for r in report.records if r.check == "output"} == set(sdm.SDM_REGIMES)


def test_a_nondeterministic_impl_fails_the_gate_without_being_asked() -> None:
    """A few ulps of one element that differ from call to call fail the gate: the op's contract makes determinism
    gating (every tolerance check passes)."""
    calls = [0]

    def wobbly(*args, **kwargs):  # type: ignore[no-untyped-def]
        y, bank = sdm_torch_chunk(*args, **kwargs)
        calls[0] += 1
        y = y.contiguous().clone()
        y.view(-1)[0] += calls[0] * 1e-7 * y.view(-1)[0].abs()
        return y, bank

    report = _gate(wobbly, regimes=["typical"], T=40)
    assert _failed(report) == {"determinism"}, [f"{r.check} {r.detail}" for r in report.failures]


def test_a_ragged_last_chunk_bug_is_caught_by_the_streaming_split(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch_chunk whose padding tokens (those filling a ragged last chunk) decay their slots: right at T = 128 (no
    padding), so only the streaming split's halves (63 and 65 tokens) and the length sweep's short T catch it."""
    real = chunk_module._pad_tokens

    def decaying_pad(x: torch.Tensor, pad: int, value: float = 0.0) -> torch.Tensor:
        out = real(x, pad, value)
        if pad and x.dim() == 3 and x.dtype == torch.float32 and bool((x <= 0).all()):  # g: padding decays
            out[:, x.shape[1] :] = -0.5
        return out

    monkeypatch.setattr(chunk_module, "_pad_tokens", decaying_pad)
    report = _gate(sdm_torch_chunk, regimes=["typical"])
    assert not report.passed
    at_full_t = [r for r in report.records if r.check in ("output", "final_state") and r.reference == "oracle"]
    assert at_full_t and all(r.passed for r in at_full_t)  # the bug is invisible at the case's own T
    assert any(r.check.startswith("streaming") for r in report.failures), _failed(report)


def _mutate_slot_decays(monkeypatch: pytest.MonkeyPatch, bad: str) -> None:
    """Swap torch_chunk's per-slot decay scan for a planted bug (tests/kernels/sdm/test_sdm_torch.py's mutants)."""
    real = chunk_module._chunk_slot_decays

    def mutant(slot_w: torch.Tensor, ld: torch.Tensor, slot_r: torch.Tensor, C: int):  # type: ignore[no-untyped-def]
        L_w, L_r, L_tot = real(slot_w, ld, slot_r, C)
        if bad == "slot-decayed-twice":  # the chunk's decay applied once more for every further write of the slot
            count = (slot_w[..., :, None] == slot_w[..., None, :]).sum(-1)
            return L_w, L_r, L_tot * count
        # read-before-write: a read misses the decay its own token gave the slot
        tok_r = torch.arange(slot_r.shape[-1]) // (slot_r.shape[-1] // C)
        tok_w = torch.arange(slot_w.shape[-1]) // (slot_w.shape[-1] // C)
        own = (slot_r[..., :, None] == slot_w[..., None, :]) & (tok_r[:, None] == tok_w[None, :])
        return L_w, L_r - (own * ld[..., None, :]).sum(-1), L_tot

    monkeypatch.setattr(chunk_module, "_chunk_slot_decays", mutant)


@pytest.mark.parametrize("bad", ["slot-decayed-twice", "read-before-write"])
def test_planted_decay_bugs_are_rejected_by_the_gate(bad: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each bug fails the oracle comparison in the collision-heavy regime (many tokens of a chunk on few slots)."""
    _mutate_slot_decays(monkeypatch, bad)
    report = _gate(sdm_torch_chunk, regimes=["collisions"], T=70)
    failed = [r for r in report.failures if r.check in ("output", "final_state")]
    assert failed and all(r.regime == "collisions" for r in failed)
    assert max(r.value / r.threshold for r in failed) > 10  # rejected by a clear factor, not on the edge


def factored_pair_decay(mask: torch.Tensor, L_row: torch.Tensor, L_col: torch.Tensor) -> torch.Tensor:
    """torch_chunk's pair decay computed as ``exp(L_row) * exp(-L_col)``: exact in real numbers, but
    ``exp(-L_col)`` overflows float32 once a slot's log-decay in the chunk passes -88."""
    zero = torch.zeros((), device=mask.device)
    return torch.where(mask, L_row[..., :, None].exp() * (-L_col[..., None, :]).exp(), zero)


def test_a_factored_pair_decay_is_rejected_by_the_strong_regime(monkeypatch: pytest.MonkeyPatch) -> None:
    """The factored form passes every other regime (a slot's decay within a chunk stays far from float32's exp
    range there) and fails the strong one, which the gate runs by default."""
    monkeypatch.setattr(chunk_module, "_pair_decay", factored_pair_decay)
    others = [r for r in sdm.SDM_REGIMES if r != "strong"]
    assert _gate(sdm_torch_chunk, regimes=others, T=70).passed
    report = _gate(sdm_torch_chunk, T=70)
    failed = [r for r in report.failures if r.check in ("output", "final_state")]
    assert failed and {r.regime for r in failed} == {"strong"}, _failed(report)


def test_a_clamped_key_weighted_decay_is_no_bug_under_the_contract(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch_chunk with each write's log-decay ``g * k_val`` clamped at 0: the contract keeps the key-weighted decay to
    ``k_val >= 0`` (SDM 2.0.0's softmax write weights; signed ones grow the bank without bound), where the clamp
    changes no bit, and the oracle and every impl refuse a negative weight, where it would change the result."""
    x = sdm.make_inputs(1, 70, 2, 32, 8, 4, 4, seed=0, regime="key_weighted", initial_bank=True)
    want = sdm_torch_chunk(**x)
    real = chunk_module._chunk_slot_decays
    monkeypatch.setattr(chunk_module, "_chunk_slot_decays", lambda sw, ld, sr, C: real(sw, ld.clamp(max=0), sr, C))
    got = sdm_torch_chunk(**x)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    signed = {**x, "k_val": sdm.make_inputs(1, 70, 2, 32, 8, 4, 4, seed=0)["k_val"]}  # typical's weights, signed
    first = tuple(int(i) for i in (signed["k_val"] < 0).nonzero()[0])  # the first negative weight, named
    for fn in (sdm.sdm_recurrent, registry.get_impl("sdm", "torch_recurrent").fn, sdm_torch_chunk):
        with pytest.raises(ValueError, match=re.escape("key_weighted_decay needs k_val >= 0")) as info:
            fn(**signed)
        assert f"k_val at {first} is {float(signed['k_val'][first]):.3g}" in str(info.value)
    step = {n: signed[n][:, first[1]] for n in ("k_idx", "k_val", "q_idx", "q_val", "v", "g", "beta")}
    with pytest.raises(ValueError, match="key_weighted_decay needs k_val >= 0"):
        sdm_decode_step(**step, bank=signed["initial_bank"], key_weighted_decay=True)


def _bank_kept_in_bf16(monkeypatch: pytest.MonkeyPatch) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """torch_recurrent with its bank rounded to bf16 after every token."""
    real = recurrent_module.sdm_step

    def bf16_bank(*args):  # type: ignore[no-untyped-def]
        y, bank = real(*args)
        return y, bank.to(torch.bfloat16).float()

    monkeypatch.setattr(recurrent_module, "sdm_step", bf16_bank)
    return registry.get_impl("sdm", "torch_recurrent").fn


def test_float32_banks_pass_sdm_bf16_state_bound() -> None:
    """At bf16 the float32 banks of torch_recurrent and torch_chunk pass sdm's state bound (1e-4, tolerances.py) in
    every regime, and so does torch_chunk run chunk by chunk with its bank carried in float32 (the planted carry
    below, its rounding taken out)."""
    case = Case("sdm", **{**SHAPE, "T": 70}, dtype="bf16", mode="fwd")
    impls = [registry.get_impl("sdm", n) for n in ("torch_recurrent", "torch_chunk")]
    for fn in (*impls, chunk_by_chunk(torch.float32)):
        report = verify_case(fn, case, seeds=1, extra_seed=False)
        assert report.passed, [f"{r.check} {r.regime} {r.detail}" for r in report.failures]


@pytest.mark.parametrize("plant", ["kept", "carried"])
def test_a_bf16_bank_is_rejected_at_bf16(plant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bank kept in bf16 (rounded after every token) or carried in bf16 (rounded from chunk to chunk) fails sdm's
    bf16 state bound in the gate: the dtype's 1e-2 let both through."""
    fn = _bank_kept_in_bf16(monkeypatch) if plant == "kept" else chunk_by_chunk(torch.bfloat16)
    case = Case("sdm", **{**SHAPE, "T": 70}, dtype="bf16", mode="fwd")
    report = verify_case(fn, case, seeds=1, extra_seed=False)
    failed = [r for r in report.failures if r.check == "final_state"]
    assert failed, _failed(report)
    assert max(r.value / r.threshold for r in failed) > 10  # by a clear factor, not on the edge
    assert all(r.value < 1e-2 for r in report.records if r.check == "final_state")  # under the dtype's bound
    if plant == "kept":
        assert {r.regime for r in failed} == set(sdm.SDM_REGIMES)


def test_read_before_write_in_the_token_loop_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    real = recurrent_module.sdm_step

    def read_first(bank: torch.Tensor, k_idx: torch.Tensor, k_val: torch.Tensor, q_idx: torch.Tensor, *rest):  # type: ignore[no-untyped-def]
        _, new_bank = real(bank, k_idx, k_val, q_idx, *rest)
        q_val, v, g, *tail = rest
        y, _ = real(bank, k_idx, k_val * 0, q_idx, q_val, v, g * 0, *tail)  # the bank before decay and write
        return y, new_bank

    monkeypatch.setattr(recurrent_module, "sdm_step", read_first)
    report = _gate(registry.get_impl("sdm", "torch_recurrent").fn, regimes=["typical"], T=40)
    assert "output" in _failed(report) and "final_state" not in _failed(report)


# -------------------------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "shape, message",
    [
        ("B=1,T=40,H=1,S=16,D=4,W=17,R=3", "W=17 and R=3 distinct slots per token must not exceed the bank's S=16"),
        ("B=1,T=40,H=1,S=16,D=4,W=3,R=20", "W=3 and R=20 distinct slots per token must not exceed the bank's S=16"),
        ("B=1,T=40,H=1,D=4,W=3,R=3", "lacks S"),
        ("B=1,T=40,H=1,S=16,K=4,W=3,R=3", "unknown dimension 'K'"),
        ("B=1,T=40,H=1,S=0,D=4,W=3,R=3", "S must be at least 1"),
    ],
    ids=["W>S", "R>S", "no-S", "delta-dims", "S=0"],
)
def test_bad_shapes_exit_2_with_one_line(capsys: pytest.CaptureFixture[str], shape: str, message: str) -> None:
    code, out, err = run_cli(capsys, "verify", "--op", "sdm", "--impl", "torch_chunk", "--shape", shape)
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and len(lines) == 1 and message in lines[0], err


def test_bad_regime_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "verify", "--op", "sdm", "--impl", "torch_chunk", "--shape", SMALL,
                           "--regime", "bursty")  # fmt: skip
    assert (
        code == 2
        and "use typical, collisions, long, key_weighted, strong" in err
        and len(err.strip().splitlines()) == 1
    )


BAD_CALLS = {  # what each sdm impl (and the oracle) refuses with a one-line ValueError
    "index out of range": (lambda x: x["k_idx"].__setitem__((0, 3, 0, 1), 16), "k_idx holds slot 16 outside [0, 16)"),
    "negative read slot": (lambda x: x["q_idx"].__setitem__((0, 2, 0, 0), -1), "q_idx holds slot -1 outside"),
    "repeated write slot": (
        lambda x: x["k_idx"][:, 5, :, 1].copy_(x["k_idx"][:, 5, :, 0]),
        "k_idx repeats write slot",
    ),
    "S not matching": (lambda x: x.update(num_slots=12), "num_slots=12 does not match initial_bank's S=16"),
    "W > S": (
        lambda x: x.update(num_slots=2, initial_bank=None),
        "selects 3 slots per token, more than the bank's S=2",
    ),
}


@pytest.mark.parametrize("impl", ["oracle", "torch_recurrent", "torch_chunk"])
@pytest.mark.parametrize("bad", list(BAD_CALLS))
def test_bad_calls_are_one_line_value_errors(impl: str, bad: str) -> None:
    edit, message = BAD_CALLS[bad]
    x = sdm.make_inputs(1, 40, 1, 16, 4, 3, 3, seed=1, initial_bank=True)
    edit(x)
    fn = sdm.sdm_recurrent if impl == "oracle" else registry.get_impl("sdm", impl).fn
    with pytest.raises(ValueError) as info:
        fn(**x)
    assert message in str(info.value) and "\n" not in str(info.value)


# ----------------------------------------------------------------------------------------------------------- suites


def test_suites_load_and_name_their_jobs() -> None:
    smoke = load_suite("sdm-smoke")
    assert smoke.device == "cpu" and smoke.baselines == {"sdm": "torch_recurrent"}
    jobs = smoke.jobs(device="cpu")
    assert {i for _, i in jobs} == {"torch_recurrent", "torch_chunk"} and {c.mode for c, _ in jobs} == {
        "fwd",
        "fwd+bwd",
    }
    gpu = load_suite("sdm-gpu")
    assert gpu.device == "cuda"
    sdm_plan = next(p for p in gpu.ops if p.op == "sdm")
    assert set(sdm_plan.impls) == {"torch_chunk", "triton_chunk", "sdm_pkg_chunk"} and sdm_plan.dtypes == ("bf16",)
    flagship = {"H": 2, "S": 65536, "D": 1024, "W": 64, "R": 64}
    assert [s["T"] for s in sdm_plan.shapes if all(s[k] == v for k, v in flagship.items())] == [8192, 32768]
    dense = [s for s in sdm_plan.shapes if {"S": 128, "D": 128, "W": 128, "R": 128}.items() <= s.items()]
    assert len(dense) == 1  # the dense limit
    assert next(p for p in gpu.ops if p.op == "gdn").shapes == ({"B": 1, "T": 8192, "H": 2, "K": 128, "V": 128},)


def test_gpu_suite_on_the_cpu_ends_every_job_unsupported_with_a_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    out = tmp_path / "results.json"
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--suite", "sdm-gpu", "--device", "cpu", "--out", str(out), "--no-db", "--quiet"])
    doc = ResultDocument.from_json(out.read_text())
    assert len(doc.jobs) == 3 * 3 * 2 + 2 * 2
    assert all(j.status == "unsupported" and j.reason for j in doc.jobs), [(j.impl, j.status) for j in doc.jobs]
    reasons = {(j.case.op, j.impl, "memory traffic" in j.reason or "interpreter" in j.reason) for j in doc.jobs}
    assert ("sdm", "torch_chunk", True) in reasons and ("sdm", "triton_chunk", True) in reasons
    assert exit_info.value.code == 0, exit_info.value.code
