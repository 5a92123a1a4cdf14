"""The verification engine: which checks it runs, what it records, and how it treats broken impls."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

from deltabench.correctness.checks import along_reference, compare, rel_fro, worst_element
from deltabench.correctness.engine import verify_case
from deltabench.correctness.plan import split_point
from deltabench.correctness.tolerances import (
    FEW_ELEMENT_TOLERANCES,
    FEW_ELEMENTS,
    REGIME_TOLERANCES,
    TOLERANCES,
    TRITON_INTERPRETER_BF16,
    family_of,
    threshold,
)
from deltabench.harness import BadInput, Case, get_impl, get_op

TINY = {"B": 1, "T": 70, "H": 2, "K": 8, "V": 12}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def oracle_cast(op: str, *, nan_at: int | None = None, out_dtype: torch.dtype | None = None, noise: float = 0.0):
    """The float64 oracle, its output cast to v's dtype and its state to float32 (optionally broken)."""
    spec = get_op(op)

    def fn(q, k, v, *gates, scale=None, initial_state=None):
        o, s = spec.oracle(q, k, v, *gates, scale=scale, initial_state=initial_state)
        o = o.to(out_dtype or v.dtype)
        if nan_at is not None and nan_at < o.shape[1]:
            o = o.clone()
            o[0, nan_at, 0, 0] = float("nan")
        if noise:
            o = o + noise * torch.randn_like(o)  # a different result on every call
        return o, s.float()

    return fn


def test_split_point_avoids_chunk_multiples() -> None:
    assert split_point(1) is None
    assert split_point(2) == 1
    assert split_point(200) == 100
    assert split_point(128) == 63
    for T in range(2, 400):
        t1 = split_point(T)
        assert 1 <= t1 < T and t1 % 64 != 0


def test_metrics() -> None:
    ref = torch.tensor([[3.0, 4.0], [0.0, 0.0]])
    x = ref.clone()
    x[0, 1] = 4.5
    assert rel_fro(x, ref) == pytest.approx(0.1)
    assert worst_element(x, ref) == (pytest.approx(0.5), [0, 1])
    x[1, 0] = float("nan")
    assert rel_fro(x, ref) == float("inf")
    assert worst_element(x, ref)[1] == [1, 0]
    recs = compare("output", x, ref, threshold=1.0, seed=0, regime="typical", initial_state=False, reference="oracle")
    assert [r.metric for r in recs] == ["rel_fro", "max_abs"]
    assert not recs[0].passed and recs[0].gating and not recs[1].gating


def test_a_failed_record_says_how_much_of_its_error_lies_along_the_reference() -> None:
    """A scale error lies along the reference whole; noise unrelated to the reference hardly; only a failed record
    says it (its detail), a passing one keeps an empty detail."""
    gen = torch.Generator().manual_seed(0)
    ref = torch.randn(64, 128, generator=gen, dtype=torch.float64)
    noise = 0.02 * torch.randn(64, 128, generator=gen, dtype=torch.float64)
    assert along_reference(1.01 * ref, ref) == pytest.approx(0.01)
    assert along_reference(-ref, ref) == pytest.approx(-2.0)
    assert rel_fro(ref + noise, ref) == pytest.approx(0.02, rel=0.05)
    assert abs(along_reference(ref + noise, ref)) < 1e-3
    assert along_reference(ref, torch.zeros_like(ref)) == 0.0
    where = {"seed": 0, "regime": "typical", "initial_state": False, "reference": "oracle"}
    scaled = compare("grad:k", 1.05 * ref, ref, threshold=9e-3, **where)[0]
    assert not scaled.passed and scaled.detail == "+5.00e-02 along the reference"
    noisy = compare("grad:k", ref + noise, ref, threshold=9e-3, **where)[0]
    assert not noisy.passed and float(noisy.detail.split()[0]) == pytest.approx(0.0, abs=1e-3)
    assert compare("grad:k", 1.001 * ref, ref, threshold=9e-3, **where)[0].detail == ""


def test_tolerances_cover_every_dtype_and_family() -> None:
    for dtype, bounds in TOLERANCES.items():
        assert set(bounds) == {"output", "state", "gradient", "streaming", "boundary"}
        assert all(0 < b < 0.05 for b in bounds.values()), dtype
    assert family_of("grad:initial_state") == "gradient"
    assert family_of("streaming:final_state") == "streaming"
    assert threshold("bfloat16", "final_state") == TOLERANCES["bf16"]["state"]
    # A gradient off by 1% must fail at every dtype (the planted-bug tests show it on real impls).
    assert all(bounds["gradient"] < 0.01 for bounds in TOLERANCES.values())
    # The Triton interpreter's truncating bf16 casts get their own bound; its fp32 and fp16 do not.
    assert threshold("bf16", "grad:q", profile="triton_interpreter") == TRITON_INTERPRETER_BF16
    assert threshold("fp32", "grad:q", profile="triton_interpreter") == TOLERANCES["fp32"]["gradient"]
    with pytest.raises(ValueError, match="profile"):
        threshold("bf16", "output", profile="gpu")


def test_regime_and_size_select_their_own_bounds() -> None:
    """The strong and long regimes' bf16 gradient bounds apply to gradients drawn in that regime only; the few-element
    bound to tensors under FEW_ELEMENTS only; fp32 keeps its bounds, fp16 its regime bounds."""
    strong = REGIME_TOLERANCES[("bf16", "strong")]["gradient"]
    few = FEW_ELEMENT_TOLERANCES["bf16"]["gradient"]
    base = TOLERANCES["bf16"]["gradient"]
    assert base < 0.01 < strong < few < 1.0  # a zero or sign-flipped gradient (rel 1, 2) fails even so
    assert threshold("bf16", "grad:g", regime="strong") == strong
    assert threshold("bf16", "grad:g", regime="typical") == base < 0.01
    assert threshold("bf16", "grad:g", regime="long") == REGIME_TOLERANCES[("bf16", "long")]["gradient"] < strong
    assert threshold("bf16", "output", regime="strong") == TOLERANCES["bf16"]["output"]
    assert threshold("bf16", "grad:g", regime="long", numel=FEW_ELEMENTS - 1) == few
    assert threshold("bf16", "grad:g", regime="typical", numel=FEW_ELEMENTS) == base
    assert threshold("bf16", "output", numel=2) == TOLERANCES["bf16"]["output"]
    assert threshold("fp32", "grad:g", regime="strong", numel=2) == TOLERANCES["fp32"]["gradient"]
    assert threshold("fp16", "grad:g", regime="strong") == TOLERANCES["fp16"]["gradient"]
    assert threshold("fp16", "grad:g", numel=2) == FEW_ELEMENT_TOLERANCES["fp16"]["gradient"] < few
    assert threshold("bf16", "grad:q", profile="triton_interpreter", regime="strong") == max(
        strong, TRITON_INTERPRETER_BF16
    )


@pytest.mark.parametrize("op", ["gdn", "gdn2", "kda"])
def test_oracle_cast_passes_with_every_check(op: str) -> None:
    case = Case(op, **TINY, dtype="bf16", mode="fwd+bwd", seed=5)
    report = verify_case(oracle_cast(op), case, seeds=2)
    assert report.passed, [(r.check, r.value) for r in report.failures]
    assert report.seeds[:2] == [5, 6] and report.seeds[2] == report.drawn_seed and len(report.seeds) == 3
    assert report.reference.startswith("float64 oracle; regimes typical, long, strong; lengths T=128, T=64, T=1")
    grads = {f"grad:{n}" for n in get_op(op).args}
    for seed in report.seeds:
        for h0 in (False, True):
            checks = {r.check for r in report.records if r.seed == seed and r.initial_state == h0}
            expected = {"finite", "output", "final_state", "inputs_unchanged", *grads}
            expected |= {"streaming:output", "streaming:final_state"} if h0 else set()
            assert expected <= checks
            assert ("grad:initial_state" in checks) == h0
    det = [r for r in report.records if r.check == "determinism"]
    assert len(det) == 1 and det[0].passed and not det[0].gating
    for r in report.records:
        if r.metric == "rel_fro" and r.reference == "oracle":
            assert r.threshold == threshold("bf16", r.check, regime=r.regime) and r.worst_index is not None
    json.dumps(report.to_dict())


def test_forward_mode_checks_no_gradient() -> None:
    report = verify_case(oracle_cast("gdn"), Case("gdn", **TINY, mode="fwd"), seeds=1, extra_seed=False)
    assert report.passed and report.seeds == [0] and report.drawn_seed is None
    assert not any(r.check.startswith("grad:") for r in report.records)


def test_t_equal_one_skips_streaming_without_failing() -> None:
    report = verify_case(oracle_cast("kda"), Case("kda", 1, 1, 1, 4, 4, mode="fwd+bwd"), seeds=1, extra_seed=False)
    assert report.passed
    notes = [r for r in report.records if r.check == "streaming"]
    assert notes and all(not r.gating and "T=1" in r.detail for r in notes)


def test_non_finite_output_fails_and_is_located() -> None:
    report = verify_case(oracle_cast("gdn", nan_at=3), Case("gdn", **TINY), seeds=1, extra_seed=False)
    assert not report.passed
    finite = [r for r in report.records if r.check == "finite" and r.initial_state is False]
    assert finite[0].value == 1 and not finite[0].passed and "o: 1 non-finite" in finite[0].detail
    out = next(r for r in report.records if r.check == "output" and r.metric == "rel_fro")
    assert not out.passed and out.worst_index == [0, 3, 0, 0]
    json.dumps(report.to_dict())  # inf becomes null, the document stays valid JSON


def test_output_in_the_wrong_dtype_breaks_the_contract() -> None:
    fn = oracle_cast("gdn", out_dtype=torch.float32)
    report = verify_case(fn, Case("gdn", **TINY, dtype="bf16"), seeds=1, extra_seed=False)
    assert {r.check for r in report.failures} == {"contract"}
    assert "expected the case's dtype" in report.failures[0].detail


def test_impl_exceptions_propagate() -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("kernel launch failed")

    with pytest.raises(RuntimeError, match="kernel launch failed"):
        verify_case(broken, Case("gdn", **TINY), seeds=1, extra_seed=False)


def test_determinism_is_reported_and_gates_only_on_request() -> None:
    fn = oracle_cast("gdn", noise=1e-9)
    case = Case("gdn", **TINY, dtype="fp32")
    relaxed = verify_case(fn, case, seeds=1, extra_seed=False)
    det = next(r for r in relaxed.records if r.check == "determinism")
    assert relaxed.passed and not det.passed and not det.gating and det.value > 0 and "o" in det.detail
    strict = verify_case(fn, case, seeds=1, extra_seed=False, gate_determinism=True)
    assert not strict.passed and [r.check for r in strict.failures] == ["determinism"]


def test_forward_only_impl_is_noted_not_failed() -> None:
    impl = get_impl("gdn", "triton_recurrent")
    assert not impl.supports_backward
    report = verify_case(impl, Case("gdn", 1, 40, 1, 16, 16, mode="fwd+bwd"), seeds=1, extra_seed=False)
    assert report.passed
    assert any(r.check == "gradients" and not r.gating for r in report.records)
    assert not any(r.check.startswith("grad:") for r in report.records)
    # the length sweep runs it forward only rather than skipping it as unable to run a backward
    assert {r.reference for r in report.records if r.check == "boundary:output"}
    assert not any(r.check.startswith("length") for r in report.records)


def test_auto_reference_leaves_the_oracle_at_large_shapes() -> None:
    """Above the oracle budget: torch_chunk in fp32 at the full shape, plus the oracle at a shorter T."""
    case = Case("gdn", B=2, T=300, H=2, K=8, V=8, dtype="bf16", mode="fwd+bwd")
    report = verify_case(get_impl("gdn", "torch_chunk"), case, seeds=1, extra_seed=False, oracle_max_elements=5e4)
    assert report.passed, [(r.check, r.reference, r.value) for r in report.failures]
    assert report.reference.startswith("torch_chunk in fp32 at full T, float64 oracle at B1-T256-H2-K8-V8;")
    refs = {r.reference for r in report.records if r.metric == "rel_fro"}
    assert {"torch_chunk_fp32", "oracle at B1-T256-H2-K8-V8"} <= refs
    small = verify_case(oracle_cast("gdn"), case, seeds=1, extra_seed=False, reference="oracle")
    assert small.reference.startswith("float64 oracle;")


def test_the_gate_says_where_its_time_went() -> None:
    """Each stage's seconds (the reference's and the oracle's apart), in a non-gating note outside the records."""
    case = Case("gdn", B=2, T=300, H=2, K=8, V=8, dtype="bf16", mode="fwd+bwd")
    report = verify_case(get_impl("gdn", "torch_chunk"), case, seeds=1, extra_seed=False, oracle_max_elements=5e4)
    stages = set(report.stage_s)
    assert {"impl at full shape", "reference at full shape", "oracle at B1-T256-H2-K8-V8", "streaming"} <= stages
    assert {"length sweep", "determinism"} <= stages and all(s >= 0 for s in report.stage_s.values())
    note = report.time_record
    assert note.check == "gate time" and not note.gating and note.passed and note not in report.records
    total, _, parts = note.detail.partition(" s: ")
    assert float(total) == pytest.approx(sum(report.stage_s.values()), abs=0.1)
    longest = max(report.stage_s, key=report.stage_s.__getitem__)
    assert parts.startswith(longest) and report.to_dict()["stage_s"] == report.stage_s
    oracle = verify_case(oracle_cast("gdn"), Case("gdn", **TINY), seeds=1, extra_seed=False)
    assert {"impl at full shape", "oracle at full shape"} <= set(oracle.stage_s)


def test_a_gate_against_the_chunked_reference_holds_one_run_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """At the full shape each run is checked and streamed, then let go (the first with an initial state is kept for
    the determinism check); at the reduced case the runs are held a stacked oracle call at a time. An op whose
    state is large (sdm's flagship bank) otherwise held every run of the gate at once."""
    import gc
    import weakref

    from deltabench.correctness import engine

    made: list[tuple[int, weakref.ref]] = []
    most_alive: dict[int, int] = {}
    run_impl = engine.run_impl

    def tracked(impl, spec, case, variant, **kw):  # type: ignore[no-untyped-def]
        gc.collect()
        alive = sum(1 for T, ref in made if T == case.T and ref() is not None)
        most_alive[case.T] = max(most_alive.get(case.T, 0), alive)
        item = run_impl(impl, spec, case, variant, **kw)
        made.append((case.T, weakref.ref(item)))
        return item

    monkeypatch.setattr(engine, "run_impl", tracked)
    case = Case("gdn", B=2, T=300, H=2, K=8, V=8, dtype="bf16", mode="fwd+bwd")
    report = verify_case(get_impl("gdn", "torch_chunk"), case, seeds=2, extra_seed=False, oracle_max_elements=5e4)
    assert report.passed
    assert sum(1 for T, _ in made if T == 300) == 12  # two seeds, three regimes, without and with an initial state
    assert most_alive[300] <= 1  # the first run with an initial state, kept for the determinism check
    # at the reduced case (B1-T256; the length sweep's longest length too) a stacked oracle call's runs, not all:
    # one a call here (B1-T256-H2-K8-V8 is 32768 of the 5e4 elements a call may hold)
    assert sum(1 for T, _ in made if T == 256) >= 12 and most_alive[256] <= 1, most_alive


def test_unknown_reference_is_bad_input() -> None:
    with pytest.raises(BadInput, match="unknown reference"):
        verify_case(oracle_cast("gdn"), Case("gdn", **TINY), reference="fla")


def test_nan_filled_empty_reaches_kernel_code_only(nan_filled_empty: None) -> None:
    """The conftest fixture NaN-fills allocations made from deltabench.kernels code, not from anywhere else."""
    kernel_globals = {"__name__": "deltabench.kernels.fake", "torch": torch}
    exec("def alloc():\n    return torch.empty(4), torch.empty_like(torch.ones(2))", kernel_globals)
    a, b = kernel_globals["alloc"]()
    assert torch.isnan(a).all() and torch.isnan(b).all()
    assert not torch.isnan(torch.zeros(3).new_empty(3).fill_(0)).any()
    assert not torch.isnan(torch.empty(5).zero_()).any()


def test_stacked_and_padded_oracle_matches_the_oracle_run_alone() -> None:
    """The gate stacks a case's runs along B (and pads the sweep's shorter lengths) into one oracle call: against
    the oracle run alone on each input, cast to fp32, every value agrees to fp32 rounding."""
    report = verify_case(oracle_cast("gdn2"), Case("gdn2", **TINY, mode="fwd+bwd"), seeds=2, extra_seed=False)
    values = [r.value for r in report.records if r.metric == "rel_fro" and r.reference.startswith("oracle")]
    assert len(values) > 100 and max(values) < 1e-6


def test_a_nan_input_left_alone_is_not_a_write() -> None:
    """The input check compares NaN with NaN as unchanged (a non-finite state streamed back in is the finite
    check's to report), and still names an input whose NaN the impl overwrote."""
    from deltabench.correctness.calls import call_impl

    spec = get_op("gdn")
    case = Case("gdn", B=1, T=3, H=1, K=4, V=4, dtype="fp32")
    inputs = {n: torch.randn(*spec.arg(n).shape(case.dims)) for n in spec.args}
    inputs["initial_state"] = torch.full((1, 1, 4, 4), float("nan"))

    def reads(q, k, v, g, beta, scale=None, initial_state=None):
        return torch.zeros_like(v), initial_state.clone()

    def clears(q, k, v, g, beta, scale=None, initial_state=None):
        initial_state.nan_to_num_(0.0)
        return torch.zeros_like(v), initial_state.clone()

    assert call_impl(reads, spec, inputs, None).mutated == []
    assert call_impl(clears, spec, inputs, None).mutated == ["initial_state"]


def _gdn_chunk_scaled(factor: float):
    """torch_chunk with its output scaled by `factor`, counting its calls."""
    base = get_impl("gdn", "torch_chunk")
    calls: list[int] = []

    def impl(q, k, v, g, beta, scale=None, initial_state=None):
        calls.append(1)
        o, state = base(q, k, v, g, beta, scale=scale, initial_state=initial_state)
        return o * factor, state

    impl.calls = calls  # type: ignore[attr-defined]
    return impl


@pytest.mark.parametrize("reference", ["torch_chunk", "oracle"])
def test_a_gate_told_to_stop_at_its_first_failure_stops_there(reference: str) -> None:
    case = Case(op="gdn", B=1, T=40, H=2, K=8, V=8, dtype="fp32", mode="fwd", device="cpu")
    wrong = _gdn_chunk_scaled(1.1)
    full = verify_case(wrong, case, seeds=2, extra_seed=False, reference=reference)
    calls_full = len(wrong.calls)
    wrong.calls.clear()
    short = verify_case(wrong, case, seeds=2, extra_seed=False, reference=reference, stop_at_failure=True)
    assert not full.passed and not short.passed
    assert len(wrong.calls) < calls_full
    (note,) = [r for r in short.records if r.check == "gate"]
    assert "stopped at its first failure" in note.detail and note.passed and not note.gating
    assert not any(r.check.startswith(("streaming", "boundary", "determinism")) for r in short.records)
    if reference == "torch_chunk":  # one run at the full shape, then the stop: no reduced-case oracle either
        assert note.detail.startswith("stopped at its first failure (1 of ")
        assert {r.seed for r in short.records if r.seed is not None} == {case.seed}
        assert not any((r.reference or "").startswith("oracle") for r in short.records)
    # a right impl told to stop at its first failure runs every check, as without the flag
    right = get_impl("gdn", "torch_chunk")
    a = verify_case(right, case, seeds=2, extra_seed=False, reference=reference, stop_at_failure=True)
    b = verify_case(right, case, seeds=2, extra_seed=False, reference=reference)
    assert a.passed and [(r.check, r.seed, r.value) for r in a.records] == [
        (r.check, r.seed, r.value) for r in b.records
    ]
