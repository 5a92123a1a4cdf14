"""Run and job matching: which job of the head answers which job of the base, what settles a pair before any
timing (correctness, comparability, a job missing), and the timing grade of the rest through :class:`GradingRule`.

Jobs are matched by (op, impl, shape, dtype, mode); within a run the highest attempt wins. A head job that is
incorrect, failed, timed out or ran out of memory while its base was not failing is a correctness failure. A job
missing on one side, failing on both, unsupported, or measured on a different machine class or major software is
not comparable; a base job missing in the head fails the comparison unless missing jobs are allowed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from deltabench.harness.document import Environment, JobResult, ResultDocument
from deltabench.harness.series import JobKey, context_mismatch, job_key

from .noise import RunSpread, default_spread, same_run_spread
from .result import (
    BAD_STATUSES,
    CORRECTNESS_FAILURE,
    MISSING_IN_HEAD,
    NOT_COMPARABLE,
    Comparison,
    JobComparison,
)
from .rule import GradingRule
from .sequential import looks_of, sequential_rule

__all__ = ["RunJobs", "compare_documents", "compare_job_pairs", "compare_jobs", "interleaved", "latest_by_key"]


def _timing_ok(job: JobResult) -> bool:
    return job.timing is not None and job.timing.median_ms > 0


def _verdict_before_timing(
    base: JobResult | None, head: JobResult | None, mismatch: str | None, common: dict[str, Any]
) -> JobComparison | None:
    """The outcome when status or context settles it (correctness, comparability), else None: timings decide."""
    bs, hs = common["base_status"], common["head_status"]
    if head is None:
        return JobComparison(outcome=NOT_COMPARABLE, reason=MISSING_IN_HEAD, **common)
    if hs in BAD_STATUSES:
        why = f"head {hs}" + (f": {head.reason}" if head.reason else "")
        if bs in BAD_STATUSES:
            return JobComparison(outcome=NOT_COMPARABLE, reason=f"failing on both sides ({why}; base {bs})", **common)
        was = "new in head" if base is None else f"base {bs}"
        return JobComparison(outcome=CORRECTNESS_FAILURE, reason=f"{why} ({was})", **common)
    if base is None:
        return JobComparison(outcome=NOT_COMPARABLE, reason="missing in base (new job)", **common)
    if hs == "unsupported" or bs == "unsupported":
        side = "head" if hs == "unsupported" else "base"
        why = (head if side == "head" else base).reason
        return JobComparison(outcome=NOT_COMPARABLE, reason=f"unsupported in {side}: {why}".rstrip(": "), **common)
    if bs in BAD_STATUSES:
        return JobComparison(outcome=NOT_COMPARABLE, reason=f"base was {bs}; head is {hs} now", **common)
    if mismatch:
        return JobComparison(outcome=NOT_COMPARABLE, reason=f"different context: {mismatch}", **common)
    if not (_timing_ok(base) and _timing_ok(head)):
        side = "base" if not _timing_ok(base) else "head"
        return JobComparison(outcome=NOT_COMPARABLE, reason=f"no timing in {side}", **common)
    return None


def compare_job_pairs(
    pairs: Sequence[tuple[JobResult | None, JobResult | None]],
    *,
    rule: GradingRule | None = None,
    base_env: Environment | None = None,
    head_env: Environment | None = None,
    spreads: Mapping[JobKey, RunSpread] | None = None,
    machine_kind: str | None = None,
    default_sigma: float | None = None,
    interleaved: bool = False,
    same_run: bool = False,
) -> list[JobComparison]:
    """Grade every (base, head) pair: status and context first, then the timings of the jobs with raw samples on
    both sides in one vectorised :meth:`GradingRule.grade_samples` call.

    `spreads` holds the run-to-run spread of jobs with history; the others are judged on the spread between their
    repetitions when both runs repeated them (``run --repeat N``), else get `default_sigma` when given (a spread
    measured on the user's own machine), else the measured default of `machine_kind` (else the base environment's
    machine class): :meth:`GradingRule.run_to_run` makes that choice; `interleaved` (the two runs came from one
    ``run --base-ref`` invocation) puts the repetitions first. `same_run` (two impls of one run) has no
    run-to-run spread between the sides: each pair is judged on its samples (``noise.same_run_spread``).
    """
    rule = rule or GradingRule()
    spreads = spreads or {}
    if same_run:
        fallback = same_run_spread()
    elif default_sigma is not None:
        fallback = RunSpread(sigma=default_sigma, source="default", measured=True)
    else:
        fallback = default_spread(machine_kind or (base_env.machine_kind if base_env is not None else None))
    out: list[JobComparison | None] = []
    commons: list[dict[str, Any]] = []
    sampled: list[int] = []
    # The same two environments for every pair: their mismatch is worked out once, not once a job.
    mismatch = context_mismatch(base_env, head_env) if base_env is not None and head_env is not None else None
    for base, head in pairs:
        if base is None and head is None:
            raise ValueError("compare_jobs needs a job on at least one side")
        op, impl, shape, dtype, mode = job_key(head if head is not None else base)  # type: ignore[arg-type]
        common: dict[str, Any] = {
            "op": op,
            "impl": impl,
            "shape": shape,
            "dtype": dtype,
            "mode": mode,
            "base_status": base.status if base is not None else None,
            "head_status": head.status if head is not None else None,
            "base_median_ms": base.timing.median_ms if base is not None and base.timing is not None else None,
            "head_median_ms": head.timing.median_ms if head is not None and head.timing is not None else None,
        }
        commons.append(common)
        verdict = _verdict_before_timing(base, head, mismatch, common)
        if verdict is None:
            bt, ht = base.timing, head.timing  # type: ignore[union-attr]
            assert bt is not None and ht is not None
            if len(bt.samples_ms) >= 1 and len(ht.samples_ms) >= 1:
                sampled.append(len(out))
            else:
                v = rule.grade_summaries(bt, ht, spreads.get((op, impl, shape, dtype, mode), fallback))
                verdict = JobComparison(
                    outcome=v.outcome, reason=v.reason, stats=v.evidence, verdict=v.verdict, **common
                )
        out.append(verdict)
    timings = [(pairs[i][0].timing, pairs[i][1].timing) for i in sampled]  # type: ignore[union-attr]
    graded = rule.grade_samples(
        [(b.samples_ms, h.samples_ms) for b, h in timings],  # type: ignore[union-attr]
        [spreads.get(_key(commons[i]), fallback) for i in sampled],
        [(b.repetitions, h.repetitions) for b, h in timings],  # type: ignore[union-attr]
        interleaved=interleaved,
    )
    for i, v in zip(sampled, graded, strict=True):
        out[i] = JobComparison(outcome=v.outcome, reason=v.reason, stats=v.evidence, verdict=v.verdict, **commons[i])
    return [r for r in out if r is not None]


def _key(common: Mapping[str, Any]) -> JobKey:
    return (common["op"], common["impl"], common["shape"], common["dtype"], common["mode"])


def compare_jobs(
    base: JobResult | None,
    head: JobResult | None,
    *,
    rule: GradingRule | None = None,
    base_env: Environment | None = None,
    head_env: Environment | None = None,
    spread: RunSpread | None = None,
) -> JobComparison:
    """Grade one job: correctness first (a broken head fails whatever the timings), then comparability, then timing."""
    job = head if head is not None else base
    spreads = {job_key(job): spread} if spread is not None and job is not None else None
    return compare_job_pairs([(base, head)], rule=rule, base_env=base_env, head_env=head_env, spreads=spreads)[0]


class RunJobs(Protocol):
    """What :func:`compare_documents` reads of a run: a :class:`ResultDocument`, or the lean
    ``db.queries.ComparisonInput`` the dashboard loads (jobs with their timings, no verification records)."""

    @property
    def run_id(self) -> str:
        """The run's id."""
        ...

    @property
    def environment(self) -> Environment:
        """Where it ran (machine class and software decide comparability)."""
        ...

    @property
    def jobs(self) -> Sequence[JobResult]:
        """Its jobs in document order."""
        ...


def latest_by_key(doc: RunJobs) -> dict[JobKey, JobResult]:
    """One job per key: the highest attempt wins, and among equals the last listed (a retry supersedes)."""
    out: dict[JobKey, JobResult] = {}
    for job in doc.jobs:
        k = job_key(job)
        if k not in out or job.attempt >= out[k].attempt:
            out[k] = job
    return out


def _incomplete(doc: ResultDocument | RunJobs) -> bool:
    """True when the document says its run was cut short (``meta.complete`` false; absent means complete)."""
    meta = getattr(doc, "meta", None) or {}
    return meta.get("complete", True) is False


def interleaved(base: ResultDocument | RunJobs, head: ResultDocument | RunJobs) -> bool:
    """True when the two runs came from one ``deltabench run --base-ref`` invocation: each document's
    ``meta.interleaved_with`` names the other run."""
    bm, hm = getattr(base, "meta", None) or {}, getattr(head, "meta", None) or {}
    return bm.get("interleaved_with") == head.run_id and hm.get("interleaved_with") == base.run_id


def compare_documents(
    base: ResultDocument | RunJobs,
    head: ResultDocument | RunJobs,
    *,
    rule: GradingRule | None = None,
    spreads: Mapping[JobKey, RunSpread] | None = None,
    default_sigma: float | None = None,
    allow_missing: bool = False,
) -> Comparison:
    """Match the jobs of two runs by (op, impl, shape, dtype, mode) and grade each (see the module docstring).

    `spreads`: the run-to-run spread of the jobs whose series has history (``noise.spread_from_history``); the
    others are graded with `default_sigma`, else the base machine class's measured default spread.
    """
    rule = rule or GradingRule()
    together = interleaved(base, head)
    # A sequential run (`run --repeat auto`) looked at its evidence several times: each look spends alpha / looks
    # (regression.sequential), and the gate grades at the level its run stopped on.
    looks = max(looks_of(getattr(base, "meta", None)), looks_of(getattr(head, "meta", None))) if together else 1
    rule = sequential_rule(rule, looks)
    bj, hj = latest_by_key(base), latest_by_key(head)
    keys = list(hj) + [k for k in bj if k not in hj]
    rows = compare_job_pairs(
        [(bj.get(k), hj.get(k)) for k in keys],
        rule=rule,
        base_env=base.environment,
        head_env=head.environment,
        spreads=spreads,
        default_sigma=default_sigma,
        interleaved=together,
    )
    return Comparison(
        base_run_id=base.run_id,
        head_run_id=head.run_id,
        base_label=base.run_id[:12],
        head_label=head.run_id[:12],
        threshold=rule.threshold,
        alpha=rule.alpha,
        rows=rows,
        context_mismatch=context_mismatch(base.environment, head.environment),
        base_commit=base.environment.git_commit,
        head_commit=head.environment.git_commit,
        head_incomplete=_incomplete(head),
        allow_missing=allow_missing,
        interleaved=together,
        looks=looks,
    )
