"""The correctness gate's engine: :func:`verify_case` runs the plan's calls, compares them with the references and
collects every property's records into a :class:`VerifyReport`.

The verification engine: is an impl right for a case? Every check returns a CheckRecord.

For each seed (``case.seed, case.seed + 1, ...`` plus one drawn from ``os.urandom`` and recorded), each gate
regime (``typical``, ``long`` and ``strong`` unless narrowed) and both variants, without and with a random initial
state, :func:`verify_case`

- calls the impl on the op's seeded inputs (on ``case.device``, in ``case.dtype``) and checks the output contract
  (shapes, ``o`` in ``v``'s dtype), that every output and gradient is finite, and that every input tensor is
  bitwise unchanged after the call (the failure names the tensor). The runs with an initial state pass a
  non-default ``scale`` (:data:`ALT_SCALE` times ``K ** -0.5``, the oracle given the same); the run without one
  in the last regime draws q and k with random norms instead of unit vectors;
- compares the output and the final state with the float64 oracle (on the very same rounded inputs; run on the
  case's GPU for a CUDA case, else on the CPU: :func:`oracle_device`): relative Frobenius error (gating) and max
  abs error with the worst element's index (reported);
- in modes ``fwd+bwd`` and ``bwd``, back-propagates random cotangents on ``o`` and on the final state through both and
  compares every gradient (q, k, v, each gate, initial_state) by name;
- streams: ``T1`` tokens, then the other ``T - T1`` from the returned state, must equal all ``T`` at once;

then sweeps lengths at the first seed (B = 1, the case's other dims, long regime, with an initial state): T rounded
to a multiple of :data:`LARGEST_CHUNK` (two to four chunks, as many as the oracle affords) streamed with its split
on a chunk boundary, a T inside one chunk streamed with its split inside it, and T = 1. A split on a chunk
boundary makes a chunked kernel do the same arithmetic streamed and at once, but for the state carried across that
boundary; its bound (``boundary`` in tolerances.py) is far below the oracle's at bf16, which is what catches a
forward-only bf16 kernel carrying its state wrongly. Finally it calls the impl twice on identical inputs to report
bitwise determinism (gating when asked, or when the op's contract demands it), and where asked
(``fresh_process``: the CLI and the runner do whenever determinism gates) replays the first of those calls in a
fresh interpreter (correctness/fresh_process.py) and holds it to the same bits (``determinism:process``).

An op that is a model's loss (its contract's ``training``: ``lm_step``) is also trained a few steps on one sequence
when the gate back-propagates, and the loss must fall (``loss falls``, correctness/training.py).

A ``decode`` case (T = 1..8 new tokens) steps from a state in every run, the state a 64-token prefix of the op
leaves (harness/ops.decode_state); its length sweep is T = 1, 3 and 8 new tokens, and nothing back-propagates.

An impl declared ``state_grad=False`` (a third-party op returning its final state detached) is back-propagated with
a zero cotangent on the final state, and so is its reference: its gradients are those of the output alone.

When the oracle is too costly at the case's shape (``reference="auto"``), the full-shape comparisons run against
the op's ``torch_chunk`` impl in fp32 on the case's device, and the oracle checks the impl at a reduced case: B = 1,
T as the sweep's longest length (at most :data:`SHORT_T`, two chunks at least), fewer heads only when the oracle
cannot afford even that. Where the reference's backward at the full shape would not fit in the device memory
(sdm's flagship: about 220 GiB at T = 8192; measured and extrapolated, or ``grad_reference_T``), the full shape
compares the output and the final state with its forward alone, and every (seed, variant) is also run, gradients
included, at the longest T that fits, against the reference there (the records and the report's reference say so);
the oracle's reduced case keeps checking gradients in every regime.

The reduced cases (the oracle's and the length sweep's) keep every dim of the case but B and T: a kernel compiled or
autotuned per head count (a Triton ``constexpr``, an autotuner's key) meets one head count per case, and their
records depend on the impl, op, dtype, mode, those dims, seeds and regimes alone. Given a
:class:`~.gate_memo.GateMemo` (a worker process running many jobs of one impl in a run), ``verify_case`` makes them
once per run and reuses them, marked as reused, in later jobs (correctness/gate_memo.py).
Exceptions raised by the impl propagate (the runner turns them into statuses); a non-finite result is a failed
record, never an exception.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

from deltabench.harness.cases import Case, has_backward
from deltabench.harness.document import CheckRecord
from deltabench.harness.errors import BadInput
from deltabench.harness.ops import OpSpec, get_op

from .calls import Item, Run, Variant, call_impl, draw_seed, run_impl
from .checks import note_record
from .gate_memo import GateMemo
from .oracle import chunk_grad_T, chunk_run, oracle_runs, stacks_onto
from .plan import back_propagates, gate_regimes, gate_variants, oracle_choice, short_case, sweep_cases
from .properties import (
    any_failed,
    compare_items,
    determinism_record,
    fresh_process_record,
    streaming_records,
    unchanged_record,
)

__all__ = [
    "VerifyReport",
    "verify_case",
    "warm_calls",
]


@dataclasses.dataclass
class VerifyReport:
    """The outcome of :func:`verify_case`: every record, the seeds used and what was compared against."""

    case: Case
    impl: str
    records: list[CheckRecord]
    seeds: list[int]
    drawn_seed: int | None
    reference: str
    stage_s: dict[str, float] = dataclasses.field(default_factory=dict)  # seconds in each stage of the gate

    @property
    def time_record(self) -> CheckRecord:
        """``gate time``, a non-gating note: the gate's seconds, then each stage's, the longest first (where a gate
        that takes minutes at a large shape spends them). Not among :attr:`records`, which two identical gates
        reproduce exactly."""
        stages = sorted(self.stage_s.items(), key=lambda kv: -kv[1])
        detail = f"{sum(self.stage_s.values()):.1f} s: " + ", ".join(f"{k} {v:.1f} s" for k, v in stages)
        return note_record("gate time", detail, passed=True, gating=False)

    @property
    def passed(self) -> bool:
        """True when every gating record passed."""
        return all(r.passed for r in self.records if r.gating)

    @property
    def failures(self) -> list[CheckRecord]:
        """The gating records that failed."""
        return [r for r in self.records if r.gating and not r.passed]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (non-finite values become null)."""
        return {
            "case": self.case.to_dict(),
            "impl": self.impl,
            "passed": self.passed,
            "seeds": list(self.seeds),
            "drawn_seed": self.drawn_seed,
            "reference": self.reference,
            "records": [json.loads(r.model_dump_json()) for r in self.records],
            "stage_s": dict(self.stage_s),
        }


class _StageClock:
    """Seconds spent in each stage of a gate: ``with clock(stage):`` adds the block's time to `stage`."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, stage: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[stage] = self.seconds.get(stage, 0.0) + time.perf_counter() - t0


def _grad_at(
    impl: Callable[..., Any],
    spec: OpSpec,
    mid: Case,
    runs: list[tuple[int, Variant]],
    *,
    profile: str,
) -> list[CheckRecord]:
    """The impl's gradients (and outputs) at `mid`, the longest T whose chunked reference's backward fits, against
    that reference for every (seed, variant) of `runs`, each with a record that the call left its inputs alone."""
    records: list[CheckRecord] = []
    label = f"torch_chunk_fp32 at {mid.shape_id} (its backward at full T does not fit)"
    for seed, variant in runs:
        it = run_impl(impl, spec, mid, variant, seed=seed, grads=True)
        records += compare_items([it], [chunk_run(mid, spec, it)], label, grads=True, profile=profile)
        where = {"seed": seed, "regime": variant.regime, "initial_state": variant.h0}
        records.append(unchanged_record([it.run], reference=f"the inputs before the call at {mid.shape_id}", **where))
    return records


def _length_sweep(
    impl: Callable[..., Any],
    spec: OpSpec,
    lengths: list[tuple[Case, int | None]],
    *,
    seed: int,
    grads: bool,
    profile: str,
    limit: float,
) -> list[CheckRecord]:
    """The impl at the sweep's cases (:func:`sweep_cases`: one seed, with an initial state), each against the
    oracle and streamed at its split, then one record that no call wrote into its inputs."""
    records: list[CheckRecord] = []
    runs: list[Run] = []
    items: list[Item] = []
    splits: list[int | None] = []
    check_case = getattr(impl, "check_case", None)
    for sub, t1 in lengths:
        why = check_case(sub) if check_case is not None else None
        if why:
            records.append(note_record(f"length T={sub.T}", f"not run: {why}", passed=True, gating=False, seed=seed))
            continue
        items.append(run_impl(impl, spec, sub, Variant(sub.regime, h0=True), seed=seed, grads=grads))
        splits.append(t1)
    for item, ref, t1 in zip(items, oracle_runs(spec, items, limit), splits, strict=True):
        records += compare_items([item], [ref], f"oracle at {item.case.shape_id}", grads=grads, profile=profile)
        stream, calls = [], []
        if spec.streaming and item.case.seqlens is None:
            stream, calls = streaming_records(
                impl, spec, item.case, item.inputs, item.run, seed=seed, h0=True, profile=profile, t1=t1
            )
        records += stream
        runs += [item.run, *calls]
    if runs:
        records.append(unchanged_record(runs, seed=seed, regime=None, initial_state=True))
    return records


def _reduced_oracle(
    impl: Callable[..., Any],
    spec: OpSpec,
    short: Case,
    runs: list[tuple[int, Variant]],
    *,
    grads: bool,
    profile: str,
    limit: float,
) -> list[CheckRecord]:
    """The impl at the reduced case `short` for every (seed, variant) of `runs`, against the oracle, each with a
    record that the call left its inputs unchanged. The runs are made and checked a stacked oracle call at a time
    (:func:`stacks_onto`), so that only those runs' tensors are held at once: an op whose state is large (sdm's
    flagship bank, 512 MiB a run and as much again for its gradient) held a gate's every run otherwise."""
    label = f"oracle at {short.shape_id}"
    records: list[CheckRecord] = []
    group: list[Item] = []

    def check(group: list[Item]) -> None:
        records.extend(compare_items(group, oracle_runs(spec, group, limit), label, grads=grads, profile=profile))
        for it in group:
            where = {"seed": it.seed, "regime": it.variant.regime, "initial_state": it.variant.h0}
            reference = f"the inputs before the call at {short.shape_id}"
            records.append(unchanged_record([it.run], reference=reference, **where))

    for seed, variant in runs:
        it = run_impl(impl, spec, short, variant, seed=seed, grads=grads)
        if group and not stacks_onto(spec, group, it, limit):
            check(group)
            group = []
        group.append(it)
    if group:
        check(group)
    return records


def _memo_key(kind: str, impl: Callable[..., Any], *parts: Any) -> tuple[Any, ...]:
    """A reduced check's key in a :class:`GateMemo`: its kind, the impl (name, backend, where it was registered
    from) and what the check was given (cases as sorted items, so that equal cases give equal keys)."""

    def frozen(x: Any) -> Any:
        if isinstance(x, Case):
            return tuple(sorted((k, frozen(v)) for k, v in x.to_dict().items()))
        if isinstance(x, (list, tuple)):
            return tuple(frozen(y) for y in x)
        return x

    who = (getattr(impl, "name", None), getattr(impl, "backend", None), getattr(impl, "source", None))
    return (kind, who, *(frozen(p) for p in parts))


def warm_calls(impl: Callable[..., Any], case: Case) -> None:
    """Call `impl` at `case` as a gate does (:func:`gate_shapes` lists where): without an initial state at the
    default scale and with one at the gate's other scale, back-propagating where ``case.mode`` is not ``fwd``.
    Nothing is checked: what an impl that compiles each shape compiled is kept in its own cache for the gate."""
    spec = get_op(case.op)
    grads = back_propagates(impl, case)
    for variant in gate_variants(spec, (case.regime,), decode=case.mode == "decode"):
        run_impl(impl, spec, case, variant, seed=case.seed, grads=grads)


def verify_case(
    impl: Callable[..., Any],
    case: Case,
    *,
    seeds: int = 3,
    extra_seed: bool = True,
    gate_determinism: bool = False,
    reference: str = "auto",
    oracle_max_elements: float | None = None,
    regimes: str | tuple[str, ...] | list[str] | None = None,
    fresh_process: bool = False,
    imports: list[str] | tuple[str, ...] = (),
    drawn_seed: int | None = None,
    memo: GateMemo | None = None,
    grad_reference_T: int | None = None,
    stop_at_failure: bool = False,
) -> VerifyReport:
    """Verify `impl` (an Impl or any callable with the op's signature) on `case`; see the module docstring.

    Args:
        impl: the implementation under test.
        case: op, dims, dtype, seed (the first of `seeds` consecutive ones), mode and device (``case.regime`` is
            the regime the case is timed in; the gate runs `regimes`).
        seeds: how many consecutive seeds, from ``case.seed``.
        extra_seed: also use a seed drawn at run time (recorded in the report).
        gate_determinism: make the bitwise-determinism record gating (it always is when the op's contract says
            ``deterministic``).
        reference: ``"auto"``, ``"oracle"`` (always the float64 oracle) or ``"torch_chunk"`` (the chunked
            torch reference in fp32 at the full shape plus the oracle at a reduced case).
        oracle_max_elements: B*T*H*K*V above which ``"auto"`` leaves the oracle (default 2e8, 4e7 with gradients).
        regimes: the gate regimes to run (default: every one, ``typical``, ``long`` and ``strong``).
        fresh_process: where determinism gates, also replay the determinism call in a fresh interpreter
            (``determinism:process``; `impl` must be a registered impl, which the new process finds by name).
        imports: the ``--import`` modules that new process loads first (where `impl` comes from one).
        drawn_seed: the extra seed when the caller drew it (a run draws one for all its jobs); None: drawn here.
        memo: reduced-case records made earlier in this process's run, reused (marked) when identical.
        grad_reference_T: with gradients against torch_chunk, the T at which its backward runs; below the case's
            T, the full shape compares outputs and final states alone (module docstring). None: the longest T
            that fits in the device memory (measured on a GPU; the full T on the CPU).
        stop_at_failure: end the gate at the first run at the full shape with a failing check (one seed and
            variant; all of them at once where the oracle takes the full shape), with a note record saying what
            was not run: a runner's gate, whose verdict that failure already settles. False: every check.

    Returns:
        A :class:`VerifyReport`; ``.passed`` is True when every gating record passed.
    """
    if seeds < 1 and not extra_seed:
        raise BadInput("verify needs at least one seed")
    spec = get_op(case.op)
    chosen_regimes = gate_regimes(spec, regimes)
    name = getattr(impl, "name", getattr(impl, "__name__", "impl"))
    grads = back_propagates(impl, case)
    if reference not in ("auto", "oracle", "torch_chunk"):
        raise BadInput(f"unknown reference {reference!r}: use auto, oracle or torch_chunk")
    limit, use_oracle = oracle_choice(case, grads, reference, oracle_max_elements)
    drawn = (draw_seed() if drawn_seed is None else drawn_seed) if extra_seed else None
    seed_list = [case.seed + i for i in range(max(seeds, 0))] + ([drawn] if drawn is not None else [])

    def reduced(key: tuple[Any, ...], make: Callable[[], list[CheckRecord]]) -> list[CheckRecord]:
        return make() if memo is None else memo.records(key, make)

    records: list[CheckRecord] = []
    if has_backward(case.mode) and not grads:
        records.append(note_record("gradients", "not checked: the impl is forward only", passed=True, gating=False))
    if grads and not getattr(impl, "state_grad", True):
        why = "the cotangent is on the output alone: the impl declares its final state without a gradient"
        records.append(note_record("gradients", why, passed=True, gating=False))
    # Triton on the CPU runs in its interpreter, whose bf16 casts truncate: its own bf16 bound (tolerances.py).
    interpreted = getattr(impl, "backend", "") == "triton" and case.device == "cpu"
    profile = "triton_interpreter" if interpreted else "native"
    short = None if use_oracle else short_case(case, limit)
    lengths = sweep_cases(case, chosen_regimes, grads=grads, limit=limit)
    first_run: Item | None = None
    variants = gate_variants(spec, chosen_regimes, decode=case.mode == "decode")
    runs = [(s, v) for s in seed_list for v in variants]
    clock = _StageClock()
    grad_t = case.T  # where the chunked reference's backward runs: below the case's T when it does not fit there

    # Packed sequences are not streamed: a split would cut a sequence, whose rest starts from no row of the state.
    streams = spec.streaming and case.seqlens is None
    if spec.streaming and not streams:
        why = "not checked for packed sequences (a split cuts one); every sequence is checked against the oracle"
        records.append(note_record("streaming", why, passed=True, gating=False))

    def streamed(it: Item) -> list[CheckRecord]:
        """`it` streamed where it has an initial state (the resumed half has one anyway), at the default scale (a
        compiling impl keeps to the shapes and static arguments it already has), and its inputs-unchanged record."""
        stream, stream_calls = [], []
        if it.variant.h0 and streams:
            with clock("streaming"):
                stream, stream_calls = streaming_records(
                    impl, spec, it.case, it.inputs, it.run, seed=it.seed, h0=True, profile=profile,
                    scale=it.variant.scale(spec, case.dims),
                )  # fmt: skip
        where = {"seed": it.seed, "regime": it.variant.regime, "initial_state": it.variant.h0}
        return [*stream, unchanged_record([it.run, *stream_calls], **where)]

    if use_oracle:
        # every run at once: the oracle stacks them along B, at the cost of about one (oracle_runs)
        with clock("impl at full shape"):
            items = [run_impl(impl, spec, case, v, seed=s, grads=grads) for s, v in runs]
        full_runs = len(items)
        with clock("oracle at full shape"):
            oracle = oracle_runs(spec, items, limit)
        records += compare_items(items, oracle, "oracle", grads=grads, profile=profile)
        del oracle
        for it in [] if stop_at_failure and any_failed(records) else items:
            records += streamed(it)
            if first_run is None and it.variant.h0:
                first_run = it
    else:
        if grads:
            with clock("reference's backward T"):
                grad_t = min(case.T, grad_reference_T or chunk_grad_T(case, spec))
        # Where grad_t < T, forward only at the full shape: the reference's backward there would run the device out
        # of memory.
        full_runs = 0
        label = f"torch_chunk_fp32 forward only (its backward fits at T={grad_t}, not T={case.T})"
        # One run at a time against its reference, so that a gate may stop at its first failure and holds one run's
        # tensors at a time (and the first with an initial state, for the determinism check).
        for s, v in runs:
            with clock("impl at full shape"):
                it = run_impl(impl, spec, case, v, seed=s, grads=grads)
            full_runs += 1
            if grad_t < case.T:
                with clock("reference at full shape"):
                    ref = chunk_run(case, spec, dataclasses.replace(it, cot=None))
                found = compare_items([it], [ref], label, grads=False, profile=profile)
                del ref  # the reference's device memory, before the gate's next allocations
                with clock(f"impl and reference fwd+bwd at T={grad_t}"):
                    found += _grad_at(impl, spec, case.replace(T=grad_t), [(s, v)], profile=profile)
            else:
                with clock("reference at full shape"):
                    ref = chunk_run(case, spec, it)
                found = compare_items([it], [ref], "torch_chunk_fp32", grads=grads, profile=profile)
                del ref
            records += found
            if stop_at_failure and any_failed(found):
                break
            records += streamed(it)
            if first_run is None and it.variant.h0:
                first_run = it
            del it
    stopped = stop_at_failure and any_failed(records)
    if stopped:
        done = f"{full_runs} of {len(runs)} runs at the full shape"
        why = f"stopped at its first failure ({done}); the reduced-case, streaming and length checks not run"
        records.append(note_record("gate", why, passed=True, gating=False))
    elif not use_oracle:
        key = _memo_key("oracle", impl, short, runs, grads, profile, limit)
        with clock(f"oracle at {short.shape_id}"):
            records += reduced(
                key, lambda: _reduced_oracle(impl, spec, short, runs, grads=grads, profile=profile, limit=limit)
            )
    if use_oracle:
        sentence = "float64 oracle"
    else:
        full_t = "at full T" if grad_t == case.T else f"at full T forward only, fwd+bwd at T={grad_t}"
        sentence = f"torch_chunk in fp32 {full_t}, float64 oracle at {short.shape_id}"
    sentence += f"; regimes {', '.join(chosen_regimes)}; lengths " + ", ".join(f"T={c.T}" for c, _ in lengths)
    if interpreted and case.dtype == "bf16":
        sentence += " (bf16 bounds of the Triton interpreter, whose casts truncate)"
    if not stopped:
        key = _memo_key("sweep", impl, lengths, seed_list[0], grads, profile, limit)
        with clock("length sweep"):
            records += reduced(
                key,
                lambda: _length_sweep(
                    impl, spec, lengths, seed=seed_list[0], grads=grads, profile=profile, limit=limit
                ),
            )
    if first_run is not None and not stopped:
        with clock("determinism"):
            scale = first_run.variant.scale(spec, case.dims)
            again = call_impl(impl, spec, first_run.inputs, first_run.cot, scale=scale)
            gating = gate_determinism or spec.deterministic
            where = {"gating": gating, "seed": first_run.seed, "regime": first_run.variant.regime}
            records.append(determinism_record(first_run.run, again.tensors(), **where))
        if gating and fresh_process:
            with clock("fresh process"):
                records.append(fresh_process_record(impl, case, first_run, imports, **where))
    if spec.training is not None and grads and not stopped:
        from .training import loss_falls_record

        with clock("loss falls"):
            records.append(loss_falls_record(impl, case))
    return VerifyReport(
        case=case, impl=name, records=records, seeds=seed_list, drawn_seed=drawn, reference=sentence,
        stage_s=clock.seconds,
    )  # fmt: skip
