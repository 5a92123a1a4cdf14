"""The one definition of a comparison result: what the CLI prints and writes as JSON, the API returns, and the
pages show (``web.schemas`` re-exports these models rather than mirroring them).

Outcomes of a job, head vs base:

- ``correctness_failure``: the head job is incorrect, failed, timed out or ran out of memory where the base was not
  failing. Always a gate failure.
- ``regression`` / ``improvement``: slower / faster beyond the threshold, the within-run test and the run-to-run
  noise (see :mod:`.rule`). A regression is a gate failure.
- ``within_noise``: the reason says which of those criteria the change did not pass.
- ``not_comparable``: missing on one side, failing on both, unsupported, no timing, or measured on a different
  machine class or major software. A job missing in the head (or a head run cut short) is also a gate failure
  unless the comparison allows missing jobs (``gate --allow-missing``).

Verdicts, what the gate answers per job and per comparison (Chromium Pinpoint's three answers):

- ``different``: a regression, an improvement or a correctness failure.
- ``same``: within noise, and the evidence could have seen a change of the threshold's size: its minimum detectable
  change (``TimingEvidence.min_detectable_change``, :mod:`.rule`) is at most the threshold, the change seen is
  within the threshold, and the run-to-run spread was measured (a history, repetitions, the same run, or a spread
  the user measured), not the machine class's assumed default.
- ``unknown``: within noise, but the evidence cannot tell a threshold-sized change from noise; the row says the
  smallest change it could have seen. A comparison is unknown when any job is, or when no job could be judged.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, computed_field, model_validator

__all__ = [
    "BAD_STATUSES",
    "CORRECTNESS_FAILURE",
    "DIFFERENT",
    "FAILING_OUTCOMES",
    "IMPROVEMENT",
    "NOT_COMPARABLE",
    "OUTCOMES",
    "REGRESSION",
    "SAME",
    "UNKNOWN",
    "VERDICTS",
    "WITHIN_NOISE",
    "Comparison",
    "JobComparison",
    "TimingEvidence",
]

REGRESSION = "regression"
IMPROVEMENT = "improvement"
WITHIN_NOISE = "within_noise"
NOT_COMPARABLE = "not_comparable"
CORRECTNESS_FAILURE = "correctness_failure"
OUTCOMES: tuple[str, ...] = (CORRECTNESS_FAILURE, REGRESSION, IMPROVEMENT, WITHIN_NOISE, NOT_COMPARABLE)
FAILING_OUTCOMES = frozenset({CORRECTNESS_FAILURE, REGRESSION})
SAME = "same"
DIFFERENT = "different"
UNKNOWN = "unknown"
VERDICTS: tuple[str, ...] = (SAME, DIFFERENT, UNKNOWN)
BAD_STATUSES = frozenset({"incorrect", "failed", "timeout", "oom"})
# The reason a job present in the base but absent in the head carries (counted by Comparison.missing_in_head).
MISSING_IN_HEAD = "missing in head"


class TimingEvidence(BaseModel):
    """The evidence behind a timing verdict: within-run statistics of the two runs' samples, and the run-to-run
    noise the change was held against."""

    model_config = ConfigDict(frozen=True)

    ratio: float  # median(head) / median(base run)
    ci_low: float | None  # (1 - alpha) bootstrap interval of that ratio; None when not computed
    ci_high: float | None
    level: float
    pvalue: float  # two-sided Mann-Whitney U, head vs base samples (1.0 when not computed)
    n_base: int
    n_head: int
    method: str  # "bootstrap+mann-whitney", "summary" or "too few samples"
    detail: str = ""  # the verdict's reason, as JobComparison.reason
    reference_ms: float | None = None  # what the head's level was held against: the history's centre, else the base's
    change: float | None = None  # head level (best time; median without raw samples) / reference - 1
    spread: float | None = None  # run-to-run spread (log scale) of the job's run level
    spread_source: str | None = None  # "history", "repetitions" (within the two runs), "default" or "same run"
    history_runs: int = 0  # past runs the spread came from (0: not from history)
    noise_bound: float | None = None  # the change a head of unchanged code exceeds with probability alpha
    base_repetitions: int = 1  # repetitions (worker processes) of the job in the base run (`run --repeat N`)
    head_repetitions: int = 1
    # The smallest change (either way, as a fraction) the rule could have flagged with this evidence: the wider of
    # the run-to-run bound and the within-run interval's half-width, at alpha. None: nothing could be flagged.
    min_detectable_change: float | None = None

    @property
    def tested(self) -> bool:
        """Whether a test ran, so that the p-value means something (not with too few samples to judge)."""
        return self.method != "too few samples"


class JobComparison(BaseModel):
    """One matched job, head vs base: its outcome, why, and the evidence."""

    model_config = ConfigDict(frozen=True)

    op: str
    impl: str
    shape: str
    dtype: str
    mode: str
    outcome: str
    reason: str = ""
    base_status: str | None = None
    head_status: str | None = None
    base_median_ms: float | None = None
    head_median_ms: float | None = None
    stats: TimingEvidence | None = None
    verdict: str | None = None  # same / different / unknown (module docstring); None: not comparable, not judged

    @model_validator(mode="after")
    def _fill_verdict(self) -> JobComparison:
        """Outcomes other than within noise fix the verdict; within noise is unknown unless the rule said same."""
        if self.outcome in (CORRECTNESS_FAILURE, REGRESSION, IMPROVEMENT):
            want: str | None = DIFFERENT
        elif self.outcome == WITHIN_NOISE:
            want = self.verdict if self.verdict in (SAME, UNKNOWN) else UNKNOWN
        else:
            want = None
        if want != self.verdict:
            object.__setattr__(self, "verdict", want)
        return self

    @property
    def key(self) -> tuple[str, str, str, str, str]:
        """(op, impl, shape, dtype, mode), as ``harness.series.job_key`` gives it."""
        return (self.op, self.impl, self.shape, self.dtype, self.mode)

    @property
    def ratio(self) -> float | None:
        """median(head) / median(base), when both were timed."""
        return self.stats.ratio if self.stats else None


class Comparison(BaseModel):
    """Head vs base over two runs: one :class:`JobComparison` per job key found on either side, and the verdict."""

    base_run_id: str
    head_run_id: str
    base_label: str = ""
    head_label: str = ""
    base_commit: str | None = None
    head_commit: str | None = None
    threshold: float
    alpha: float
    context_mismatch: str | None = None
    head_incomplete: bool = False  # the head document says the run was cut short (meta.complete false)
    allow_missing: bool = False  # jobs missing in the head, or a head cut short, do not fail the comparison
    interleaved: bool = False  # base and head ran interleaved in one invocation (`deltabench run --base-ref`)
    looks: int = 1  # a sequential run (`run --repeat auto`) looked this many times: alpha is the gate's / looks
    rows: list[JobComparison]
    skipped_points: int = Field(0, description="stored points left out as unusable (fail today's validation)")

    @computed_field  # type: ignore[prop-decorator]
    @property
    def counts(self) -> dict[str, int]:
        """Number of jobs per outcome (every outcome present, zero or not)."""
        c = dict.fromkeys(OUTCOMES, 0)
        for r in self.rows:
            c[r.outcome] += 1
        return c

    @computed_field  # type: ignore[prop-decorator]
    @property
    def verdicts(self) -> dict[str, int]:
        """Number of jobs per verdict (same, different, unknown; every verdict present, zero or not)."""
        c = dict.fromkeys(VERDICTS, 0)
        for r in self.rows:
            if r.verdict is not None:
                c[r.verdict] += 1
        return c

    @computed_field  # type: ignore[prop-decorator]
    @property
    def verdict(self) -> str:
        """The comparison's verdict: different when it failed (a regression, a correctness failure, a head missing
        jobs), else unknown when any job is unknown or no job could be judged, else different when a job improved,
        else same."""
        c = self.verdicts
        if self.failed:
            return DIFFERENT
        if c[UNKNOWN] or not (c[SAME] or c[DIFFERENT]):
            return UNKNOWN
        return DIFFERENT if c[DIFFERENT] else SAME

    @computed_field  # type: ignore[prop-decorator]
    @property
    def max_detectable_change(self) -> float | None:
        """The largest minimum detectable change among the unknown jobs (None when none has one): the size of
        change this comparison could miss."""
        found = [
            r.stats.min_detectable_change
            for r in self.rows
            if r.verdict == UNKNOWN and r.stats is not None and r.stats.min_detectable_change is not None
        ]
        return max(found) if found else None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def missing_in_head(self) -> int:
        """Jobs of the base that the head did not run."""
        return sum(r.outcome == NOT_COMPARABLE and r.reason.startswith(MISSING_IN_HEAD) for r in self.rows)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def failed(self) -> bool:
        """True when any job regressed or failed its correctness gate, or (unless missing jobs are allowed) the
        head lacks base jobs or was cut short: the CI gate exits 1."""
        if any(r.outcome in FAILING_OUTCOMES for r in self.rows):
            return True
        return not self.allow_missing and (self.head_incomplete or self.missing_in_head > 0)

    def by_outcome(self, outcome: str) -> list[JobComparison]:
        """Rows with this outcome, worst ratio first for regressions and best first for improvements."""
        rows = [r for r in self.rows if r.outcome == outcome]
        if outcome == IMPROVEMENT:
            return sorted(rows, key=lambda r: r.ratio or 1.0)
        return sorted(rows, key=lambda r: -(r.ratio or 1.0))

    def to_dict(self) -> dict[str, object]:
        """Plain-dict form for JSON (the API's response body)."""
        return self.model_dump(mode="json")
