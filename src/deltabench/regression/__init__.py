"""Regression detection: did a head run get slower than its base, job by job, beyond what unchanged code moves?

Layers, each importing only those above it in this list:

- :mod:`.samples`: statistics on timing samples (rank test, bootstrap interval of the ratio of medians), no verdicts;
- :mod:`.noise`: the run-to-run noise model (a series' history, or a machine class's measured default spread);
- :mod:`.result`: the one definition of a comparison result (CLI JSON, API and pages all use it);
- :mod:`.rule`: the grading rule, one object deciding each job with its evidence and reason;
- :mod:`.matching`: which jobs of two runs are compared, and what settles a pair before its timings;
- :mod:`.render`: the CLI table, the pull-request markdown, the summary line.
"""

from __future__ import annotations

from .matching import RunJobs, compare_documents, compare_job_pairs, compare_jobs, latest_by_key
from .noise import DEFAULT_SPREADS, RunSpread, default_spread, spread_from_history, spreads_from_histories
from .result import (
    BAD_STATUSES,
    FAILING_OUTCOMES,
    OUTCOMES,
    Comparison,
    JobComparison,
    TimingEvidence,
)
from .rule import DEFAULT_ALPHA, DEFAULT_THRESHOLD, GradingRule, Verdict

__all__ = [
    "BAD_STATUSES",
    "DEFAULT_ALPHA",
    "DEFAULT_SPREADS",
    "DEFAULT_THRESHOLD",
    "FAILING_OUTCOMES",
    "OUTCOMES",
    "Comparison",
    "GradingRule",
    "JobComparison",
    "RunJobs",
    "RunSpread",
    "TimingEvidence",
    "Verdict",
    "compare_documents",
    "compare_job_pairs",
    "compare_jobs",
    "default_spread",
    "latest_by_key",
    "spread_from_history",
    "spreads_from_histories",
]
