"""The ``run --repeat auto --base-ref`` stopping rule replayed on stored repetitions: what the sequential gate would
have decided, look by look, had two recorded runs been the two sides of one invocation.

Why: a live sequential pair is one interleaved invocation (>= 6 + 6 fresh processes), so calibrating the gate's
false failures over >= 100 pairs costs hours on a GPU. Recorded once with the cap's repetitions (``run --repeat
N``, one fresh process a repetition), K runs give K (K - 1) ordered pairs whose replay costs seconds
(``benchmarks/gate_auto_calibration.py record`` / ``replay``).

The replay takes its decisions from the gate itself: at each look of :func:`regression.sequential.look_schedule`
(the CLI's schedule for the cap and the number of jobs) both documents are cut to the repetitions the live run
would hold then (:func:`first_repetitions`: a job decided at an earlier look keeps the repetitions it stopped
with), marked as one sequential interleaved invocation (``meta.interleaved_with``, ``meta.sequential``, as
``runners.interleave`` writes them) and graded by ``regression.compare_documents``; the jobs
``regression.sequential.still_unknown`` names get the next look's repetitions, as the CLI's ``undecided`` asks.

What differs from a live pair: the two runs were made minutes apart, not interleaved round by round, so the
machine's drift between them is not shared (for false failures a harder test than the live gate's); and pairs
built from the same recorded runs are not independent (their figures need an interval over runs, not pairs).
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping, Sequence

from deltabench.harness.document import ResultDocument, TimingStats
from deltabench.harness.series import JobKey, job_key
from deltabench.regression import GradingRule, compare_documents
from deltabench.regression.result import Comparison, JobComparison
from deltabench.regression.sequential import SEQUENTIAL_META, look_schedule, still_unknown

from .timing import merge_repetitions, summarize

__all__ = ["ReplayedJob", "first_repetitions", "recorded_repetitions", "replay_sequential", "split_repetitions"]


def _repetitions(t: TimingStats, which: slice) -> TimingStats:
    """The timings of repetitions `which` (in their order) of `t`, summarised again and numbered from 0."""
    per = []
    for r in sorted(set(t.repetitions))[which]:
        kept = [x for x, i in zip(t.samples_ms, t.repetitions, strict=True) if i == r]
        per.append(summarize(kept, clock=t.clock, warmup=t.warmup, l2_flush=t.l2_flush, compile_s=t.compile_s))
    return merge_repetitions(per)


def first_repetitions(doc: ResultDocument, k: int | Mapping[JobKey, int]) -> ResultDocument:
    """`doc` as a run that stopped after `k` repetitions would hold it (`k` one count for every job, or a count per
    job key; a job not named keeps all): each job's samples of its first k repetitions, summarised again (rounds run
    in order, so the first k rounds are a k-round run that stopped there)."""
    jobs = []
    for job in doc.jobs:
        t = job.timing
        n = k if isinstance(k, int) else k.get(job_key(job))
        if t is None or not t.repetitions or n is None:
            jobs.append(job)
            continue
        jobs.append(job.model_copy(update={"timing": _repetitions(t, slice(0, n))}))
    return doc.model_copy(update={"jobs": jobs})


def split_repetitions(doc: ResultDocument, size: int) -> list[ResultDocument]:
    """`doc`'s repetitions cut into runs of `size` in their order (repetitions [c size, (c + 1) size) make run c,
    renumbered from 0), as many as every timed job fills: one ``run --repeat c*size`` invocation recording c runs
    of ``--repeat size`` without paying a process tree, a correctness gate and a document each. Each part gets a
    run id of its own (derived from `doc`'s) and says where it came from in ``meta.split_from``."""
    if size < 1:
        raise ValueError(f"size must be at least 1, got {size}")
    timed = [j.timing for j in doc.jobs if j.timing is not None and j.timing.repetitions]
    parts = min((len(set(t.repetitions)) for t in timed), default=0) // size
    out = []
    for c in range(parts):
        jobs = []
        for job in doc.jobs:
            t = job.timing
            if t is None or not t.repetitions:
                continue
            jobs.append(job.model_copy(update={"timing": _repetitions(t, slice(c * size, (c + 1) * size))}))
        run_id = uuid.uuid5(uuid.NAMESPACE_URL, f"deltabench-split:{doc.run_id}:{c}:{size}").hex
        meta = {**doc.meta, "split_from": {"run_id": doc.run_id, "part": c, "repetitions": size}}
        out.append(doc.model_copy(update={"jobs": jobs, "run_id": run_id, "meta": meta}))
    return out


def recorded_repetitions(doc: ResultDocument) -> dict[JobKey, int]:
    """How many repetitions each timed job of `doc` holds."""
    return {job_key(j): j.timing.n_repetitions for j in doc.jobs if j.timing is not None and j.timing.samples_ms}


@dataclasses.dataclass(frozen=True)
class ReplayedJob:
    """One job's end in a replayed sequential pair: the gate's row at the look it stopped on, the repetitions a
    side it used, and whether the record ran out before the rule's last look (`truncated`: still unknown with
    fewer repetitions than the cap)."""

    row: JobComparison
    repetitions: int
    looks: int
    truncated: bool


def _as_pair(
    base: ResultDocument, head: ResultDocument, schedule: Sequence[int], meta: Mapping[str, object]
) -> tuple[ResultDocument, ResultDocument]:
    """The two documents marked as the two sides of one sequential interleaved invocation (runners.interleave)."""
    seq = {**meta, "schedule": list(schedule), "looks": len(schedule)}
    b = {**base.meta, "side": "base", "interleaved_with": head.run_id, SEQUENTIAL_META: seq}
    h = {**head.meta, "side": "head", "interleaved_with": base.run_id, SEQUENTIAL_META: seq}
    return base.model_copy(update={"meta": b}), head.model_copy(update={"meta": h})


def replay_sequential(
    base: ResultDocument,
    head: ResultDocument,
    *,
    max_repeat: int = 20,
    rule: GradingRule | None = None,
) -> tuple[dict[JobKey, ReplayedJob], Comparison]:
    """Replay ``run --repeat auto --max-repeat max_repeat`` on two recorded ``--repeat N`` runs (module docstring):
    each job's end, and the gate's comparison of the two documents as the live run would have left them.

    `rule`: the gate's (default: its default threshold and alpha, as the CLI's ``--repeat auto`` uses); its alpha
    is spent over the looks by ``compare_documents``, as for a live run.
    """
    rule = rule or GradingRule()
    if base.run_id == head.run_id:
        raise ValueError("a pair needs two runs (the gate matches interleaved sides by their run ids)")
    have = {k: min(n, recorded_repetitions(head).get(k, 0)) for k, n in recorded_repetitions(base).items()}
    schedule = look_schedule(max_repeat, jobs=len(have), alpha=rule.alpha)
    if not have or min(have.values()) < schedule[0]:
        raise ValueError(f"every job needs at least the first look's {schedule[0]} repetitions on both sides")
    meta = {"threshold": rule.threshold, "alpha": rule.alpha, "max_repeat": max_repeat, "replayed": True}
    counts: dict[JobKey, int] = {}
    ended: dict[JobKey, tuple[int, bool]] = {}
    active = set(have)
    cmp: Comparison | None = None
    for i, target in enumerate(schedule):
        # A job whose record ends before this look stops where the record does: the replay cannot see its next look.
        for k in [k for k in active if have[k] < target]:
            ended[k] = (i, True)
            active.discard(k)
        if not active:
            break
        for k in active:
            counts[k] = target
        pair = _as_pair(first_repetitions(base, counts), first_repetitions(head, counts), schedule, meta)
        cmp = compare_documents(*pair, rule=rule)
        unknown = still_unknown(cmp)
        for k in list(active):
            if k not in unknown or i == len(schedule) - 1:
                ended[k] = (i + 1, False)
                active.discard(k)
        if not active:
            break
    assert cmp is not None
    rows = {r.key: r for r in cmp.rows}
    out = {k: ReplayedJob(rows[k], counts[k], looks, truncated) for k, (looks, truncated) in ended.items() if k in rows}
    return out, cmp
