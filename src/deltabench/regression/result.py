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
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, computed_field

__all__ = [
    "BAD_STATUSES",
    "CORRECTNESS_FAILURE",
    "FAILING_OUTCOMES",
    "IMPROVEMENT",
    "NOT_COMPARABLE",
    "OUTCOMES",
    "REGRESSION",
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
