"""Runs one job in this process: inputs, first call, correctness gate, memory, timing.

This is what the job's subprocess executes (see :mod:`.isolated`), one job or, in a shared worker, many of the
same impl one after another. The order matters:

1. the impl's user modules are imported (``--import``, once per process), inputs are built;
2. the first call is made and timed apart (``compile_s``; on the CPU also the host-RSS figure, over a
   high-water mark reset just before it);
3. the correctness gate (``correctness.engine.verify_case``) runs at the job's exact shape, dtype and mode, with the
   run's drawn seed; its checks at reduced cases (the oracle's, the length sweep's), which do not depend on the
   job's B and T, are made once per run in this process and reused, marked, by its later jobs
   (correctness/gate_memo.py); a failed gate ends the job as ``incorrect`` with its records and no timing (a job's
   later repetitions, ``JobSpec.repetition`` > 0, skip it: the first repetition gated the same code in the same
   run). A job of
   ``stage = "gate"`` (``deltabench run --gate-workers N``, many gates at once) ends here, ``ok`` when it passed; one
   of ``stage = "after_gate"`` skips the gate, which such a run passed, and goes on to step 4; one of
   ``stage = "compile"`` only builds what the gate will call at its shape and at ``JobSpec.compile_cases``
   (``harness.compile_ahead``: the calls themselves, or a dry run and each kernel built side by side), for the
   compiles of an impl that compiles each shape. A JAX impl
   on the CPU runs it under ``jax_bridge.cheap_compiles``: the first call's program (the one timed) is reused as
   compiled, and the dozen other programs the gate runs once each (other lengths and arguments, the backward)
   are compiled with XLA's cheap CPU settings, which on a cold cache cuts the gate's compiling about tenfold;
4. peak device memory (CUDA) and the timing, by the timer :data:`.timing.TIMERS` gives the impl's backend on the
   case's platform (host clock, CUDA events, JAX on its device; a decode step on a GPU, CUDA-graph replays:
   :func:`.timing.timer_for`); for a training step (an op with a contract's ``training``, mode fwd+bwd) then the
   mixer's share of the step (runners/step_share.py).

Any exception becomes the job's status: ``oom`` for out-of-memory, ``failed`` otherwise, with the phase
it happened in.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import sys
import time
import traceback
from typing import Any

from deltabench.harness.cases import Case
from deltabench.harness.document import CaseSpec, CheckRecord, JobResult, MemoryStats, TimingStats
from deltabench.harness.errors import is_out_of_memory
from deltabench.harness.ops import get_op

from . import integrity, integrity_hooks
from .base import JobSpec
from .timing import Timed, TimerRequest, timer_for

__all__ = ["InProcessRunner", "case_spec", "execute", "failing_summary", "parse_phase_mark"]

PHASE_MARK = "deltabench-job: phase "  # written to stderr so a parent can say where a hang happened
_imported: set[str] = set()  # user modules this process has loaded (a shared worker runs many jobs)
_default_threads: int | None = None  # torch's own intra-op thread count, before any job set it
_gate_memo: Any = None  # the gate's reduced-case records of this process's run (correctness/gate_memo.py)


def case_spec(case: Case) -> CaseSpec:
    """The document's form of a case (device dropped: the job carries it)."""
    fields = {f: v for f, v in case.to_dict().items() if f not in case.dims and f not in ("op", "device")}
    return CaseSpec.from_dims(case.op, case.dims, **fields)


def failing_summary(records: list[CheckRecord], limit: int = 3) -> str:
    """A one-line reason naming the first failing gating checks, one clause per failure with where it ran and the
    record's detail, e.g. ``grad:k rel_fro 1.0e-02 > 9.0e-03 (seed 0, regime typical, initial state; +9.9e-03 along
    the reference)``; a clause that repeats word for word is said once."""
    clauses: list[str] = []
    for r in records:
        if r.gating and not r.passed:
            value = "n/a" if r.value is None else f"{r.value:.2e}"
            limit_txt = "" if r.threshold is None else f" > {r.threshold:.1e}"
            where = "; ".join(part for part in (r.where, r.detail) if part)
            clauses.append(f"{r.check} {r.metric} {value}{limit_txt}" + (f" ({where})" if where else ""))
    clauses = list(dict.fromkeys(clauses))
    more = f" and {len(clauses) - limit} more" if len(clauses) > limit else ""
    return "failed the gate: " + "; ".join(clauses[:limit]) + more if clauses else "failed the gate"


def _phase(name: str) -> None:
    # With the wall clock: a parent that finds the job hung can say how long each phase took.
    print(f"{PHASE_MARK}{name} @{time.time():.3f}", file=sys.stderr, flush=True)


def parse_phase_mark(line: str) -> tuple[str, float | None]:
    """The phase a mark line of :func:`_phase` names and the wall-clock time it began (None for a mark without
    one, as an older deltabench's worker writes)."""
    text = line[len(PHASE_MARK) :].strip()
    name, sep, at = text.rpartition(" @")
    try:
        return (name, float(at)) if sep else (text, None)
    except ValueError:
        return text, None


def _training_step(case: Case) -> bool:
    """True for a job that times a whole training step: an op with a contract's ``training``, in mode fwd+bwd."""
    return get_op(case.op).training is not None and case.mode == "fwd+bwd"


def _time(
    impl: Any, case: Case, subject: Any, inputs: dict, job: JobSpec, first_call_s: float
) -> tuple[Timed | None, list[CheckRecord]]:
    """The job's timing by the timer the table gives the impl's backend on the case's platform
    (:func:`deltabench.runners.timing.timer_for`: host clock, CUDA events or graph replays, or JAX on its device), and
    the integrity records of its timed calls (runners/integrity.py); no timing when a timed call was refused what the
    interpreter watch refuses (runners/integrity_hooks.py: its record fails)."""
    timer = timer_for(impl.backend, case.device, case.mode)
    on = job.gate.integrity
    # A training step (runners/closures.py) changes its parameters every call, which the guard's re-checks of
    # sampled calls against the reference cannot follow: the clock's record alone, as for a timer that calls the
    # impl its own way.
    guard = None
    if on and timer.takes_guard and not _training_step(case):
        guard = integrity.TimedCallGuard(impl, case, subject, inputs, device_timer=timer.clock != "cpu_monotonic")
    try:
        timed = timer(TimerRequest(subject, impl, case, inputs, job.timing, first_call_s, guard=guard))
    except integrity_hooks.Refused:
        if guard is None:
            raise
        return None, guard.records(None)  # a timed call tried what the watch refuses: flagged, never timed
    if not on:
        return timed, []
    if guard is not None and timed.guarded:
        return timed, guard.records(timed.timing)
    return timed, [integrity.clock_record()]  # a timer that calls the impl its own way: the clock alone


def _memo_for(job: JobSpec) -> Any:
    """This process's :class:`~deltabench.correctness.gate_memo.GateMemo`, entered for `job`; None for a job outside a
    run (nothing to reuse from). Its scope is the run and the kernel sources' hash: records are reused within one
    run, for the code that made them."""
    global _gate_memo
    if job.run_id is None:
        return None
    from deltabench.correctness.gate_memo import GateMemo

    from .environment import kernel_hash

    if _gate_memo is None:
        _gate_memo = GateMemo()
    _gate_memo.enter((job.run_id, kernel_hash()), made_by=job.job_id)
    return _gate_memo


def _gate_compiles(backend: str, device: str) -> contextlib.AbstractContextManager:
    """How the gate's JAX programs compile: cheaply beyond the timed one for a JAX impl on the CPU (see step 3 of
    the module docstring), as usual otherwise."""
    if backend != "jax" or device != "cpu":
        return contextlib.nullcontext()
    from deltabench.kernels.common.jax.jax_bridge import cheap_compiles

    return cheap_compiles()


def execute(job: JobSpec) -> JobResult:
    """Run `job` in this process and return its result; every failure is a status, not an exception."""
    started = _dt.datetime.now(_dt.timezone.utc)
    from deltabench.harness.registry import load_module

    # The user's modules first: one may register the job's op, whose contract the case and its document read.
    import_error: Exception | None = None
    try:
        for module in job.imports:
            if module not in _imported:
                load_module(module)
                _imported.add(module)
    except Exception as exc:
        import_error = exc
    try:
        case = job.to_case()
        spec = case_spec(case)
    except Exception:
        if import_error is not None:
            raise import_error from None  # the job's op came from the module that failed: that is the error
        raise
    result = JobResult(
        job_id=job.job_id,
        attempt=job.attempt,
        case=spec,
        impl=job.impl,
        device=case.device,
        status="failed",
        started_at=started,
    )
    phase = "setup"
    placed = contextlib.ExitStack()  # the JAX device of the case, from the impl's first call to its timing
    try:
        from deltabench.harness.devices import keep_to_share, placement
        from deltabench.harness.ops import make_case_inputs
        from deltabench.harness.registry import get_impl

        _phase(phase)
        if import_error is not None:
            raise import_error
        impl = get_impl(case.op, job.impl)
        result.backend = impl.backend
        result.notes = impl.notes
        why = impl.check_case(case)
        if why:
            result.status, result.reason = "unsupported", why
            return _finish(result)
        placed.enter_context(placement(case.device, impl.backend))
        keep_to_share(case.device)

        import torch

        from . import memory
        from .closures import build_subject

        global _default_threads
        if _default_threads is None:
            _default_threads = torch.get_num_threads()
        if case.device == "cpu" and job.timing.cpu_threads:
            # Tiny CPU cases gain nothing from intra-op threads and suffer from them on a busy machine.
            torch.set_num_threads(job.timing.cpu_threads)
            result.notes = "; ".join(x for x in (result.notes, f"torch threads={job.timing.cpu_threads}") if x)
        else:
            torch.set_num_threads(_default_threads)  # not what an earlier job of this process asked for
        torch.manual_seed(case.seed)
        if job.stage == "compile":
            phase = "compile"
            _phase(phase)
            from deltabench.correctness.compile_ahead import compile_ahead

            cases = [case, *(Case(**c) for c in job.compile_cases)]
            with _gate_compiles(impl.backend, case.device):  # the gate's compile settings: its cache keys
                built = compile_ahead(impl, cases)
            result.status = "ok"
            result.notes = built  # a compile's result is only reported (runners/session.py), never stored
            return _finish(result)
        inputs = make_case_inputs(get_op(case.op), case)
        subject = build_subject(impl, case, inputs)
        inputs_bytes = memory.tensors_bytes(subject.held)

        phase = "first call"
        _phase(phase)
        if case.device == "cpu":
            memory.reset_rss_high_water()  # what earlier jobs of a shared worker reached is not this job's
        rss0 = memory.rss_high_water_bytes()
        t0 = time.perf_counter()
        subject()
        if case.device == "cuda":
            torch.cuda.synchronize()
        first_call_s = time.perf_counter() - t0
        mem: MemoryStats | None = None
        if case.device == "cpu":
            mem = MemoryStats(
                peak_bytes=max(memory.rss_high_water_bytes() - rss0, 0),
                inputs_bytes=inputs_bytes,
                method=memory.HOST_RSS_METHOD,
            )

        # A later repetition times what the first one gated; an "after_gate" job, what its gate-only run passed
        # (runners/session.py).
        if job.repetition == 0 and job.stage != "after_gate":
            phase = "gate"
            _phase(phase)
            from deltabench.correctness.engine import verify_case

            g = job.gate
            with _gate_compiles(impl.backend, case.device):
                report = verify_case(
                    impl,
                    case,
                    seeds=g.seeds,
                    extra_seed=g.extra_seed,
                    gate_determinism=g.gate_determinism,
                    reference=g.reference,
                    regimes=g.regimes,
                    fresh_process=True,
                    imports=job.imports,
                    drawn_seed=job.drawn_seed,
                    memo=_memo_for(job),
                    stop_at_failure=True,  # the job is incorrect at its first failure: the rest would only cost
                )
            result.verification = [*report.records, report.time_record]
            result.gate_reference = report.reference
            if not report.passed:
                result.status, result.reason = "incorrect", failing_summary(result.verification)
                return _finish(result)
            if job.stage == "gate":
                result.status = "ok"  # passed; the timing is another process's, one job at a time
                return _finish(result)

        if case.device == "cuda":
            phase = "memory"
            _phase(phase)
            mem = memory.cuda_peak(subject, inputs_bytes)

        phase = "timing"
        _phase(phase)
        timed, checks = _time(impl, case, subject, inputs, job, first_call_s)
        if timed is not None:
            timing = timed.timing
            if isinstance(timing, TimingStats) and timing.compile_s is None:
                timing.compile_s = first_call_s
            result.timing = timing
            result.memory = timed.memory if timed.memory is not None else mem
            result.notes = "; ".join(x for x in (result.notes, timed.note) if x)
            checks = [*checks, *timed.records]  # the GPU's state, the timer's own integrity records
            if _training_step(case):
                phase = "mixer share"
                _phase(phase)
                from .step_share import mixer_share_record

                result.verification = [*result.verification, mixer_share_record(subject, case)]
        result.status = "ok"  # flag() makes it incorrect, with no timing, when a defence failed
        integrity.flag(result, checks)
    except BaseException as exc:  # a job's failure is its result; the run goes on
        if isinstance(exc, KeyboardInterrupt):
            raise
        result.status = "oom" if is_out_of_memory(exc) else "failed"
        result.reason = f"{phase}: {type(exc).__name__}: {exc}".strip()[:2000]
        tb = traceback.format_exc()
        result.notes = "; ".join(x for x in (result.notes, tb[-3000:]) if x)
    finally:
        placed.close()
    return _finish(result)


def _finish(result: JobResult) -> JobResult:
    result.finished_at = _dt.datetime.now(_dt.timezone.utc)
    return result


class InProcessRunner:
    """Runs jobs in this process (what the job subprocess uses; no isolation, no timeout)."""

    def run(self, job: JobSpec) -> JobResult:
        """Run `job` here."""
        return execute(job)


integrity.guard_functions(sys.modules[__name__], ("execute", "_time", "_finish"))
