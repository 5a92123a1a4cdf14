"""Head-vs-base statistics: the grading rule on raw samples and summaries, job outcomes, document matching, series."""

from __future__ import annotations

import math

import numpy as np
import pytest
from deltabench.harness.document import CaseSpec, Environment, JobResult, ResultDocument, TimingStats
from deltabench.harness.series import SeriesKey, context_mismatch, job_key, major_minor, series_key
from deltabench.harness.stats import (
    bootstrap_ratio_ci,
    bootstrap_ratio_cis,
    compare_documents,
    compare_jobs,
    compare_sample_pairs,
    compare_samples,
    compare_summaries,
    mann_whitney_ps,
    min_attainable_p,
)


def _samples(rng: np.random.Generator, n: int, scale: float = 1.0, noise: float = 0.01) -> np.ndarray:
    """Lognormal timings with 2% outliers up to +50%, as a shared GPU or a busy CPU gives."""
    x = scale * np.exp(rng.normal(0.0, noise, n))
    out = rng.random(n) < 0.02
    x[out] *= 1.0 + rng.uniform(0.05, 0.5, out.sum())
    return x


def _timing(samples: np.ndarray | list[float]) -> TimingStats:
    s = np.asarray(samples, float)
    return TimingStats(
        samples_ms=[float(v) for v in s],
        median_ms=float(np.median(s)),
        q1_ms=float(np.quantile(s, 0.25)),
        q3_ms=float(np.quantile(s, 0.75)),
        mean_ms=float(s.mean()),
        stdev_ms=float(s.std(ddof=1)),
        sem_rel=float(1.2533 * s.std(ddof=1) / math.sqrt(s.size) / np.median(s)),
    )


def _env(**kw: object) -> Environment:
    base = {"host": "gpu-01", "machine_kind": "h200", "device_name": "NVIDIA H200", "torch": "2.13.0+cu130"}
    base.update(kw)
    return Environment(**base)  # type: ignore[arg-type]


def _job(impl: str = "triton_chunk", status: str = "ok", samples=None, attempt: int = 1, T: int = 4096) -> JobResult:
    case = CaseSpec(op="gdn", B=8, T=T, H=6, K=128, V=128, dtype="bf16", mode="fwd")
    timing = _timing(samples) if samples is not None else None
    # Unvalidated: the grading must hold for what older versions stored (an ok job without timing, a failed
    # one with a timing), which a document today is refused for.
    return JobResult.model_construct(case=case, impl=impl, status=status, timing=timing, attempt=attempt, reason="")


def test_ten_percent_slower_is_a_regression() -> None:
    rng = np.random.default_rng(1)
    r = compare_samples(_samples(rng, 40), _samples(rng, 40, 1.10))
    assert r.outcome == "regression"
    assert 1.08 < r.ratio < 1.12
    assert 1.0 < r.ci_low < r.ratio < r.ci_high
    assert r.pvalue < 1e-6


def test_ten_percent_faster_is_an_improvement() -> None:
    rng = np.random.default_rng(2)
    r = compare_samples(_samples(rng, 40), _samples(rng, 40, 0.90))
    assert r.outcome == "improvement"
    assert r.ci_high < 1.0


def test_same_distribution_never_fails_in_200_trials() -> None:
    rng = np.random.default_rng(3)
    outcomes = [compare_samples(_samples(rng, 30), _samples(rng, 30), n_resamples=500).outcome for _ in range(200)]
    assert outcomes.count("regression") == 0
    assert outcomes.count("improvement") == 0


def test_small_significant_change_is_within_noise_with_a_reason() -> None:
    rng = np.random.default_rng(4)
    r = compare_samples(_samples(rng, 200, noise=0.005), _samples(rng, 200, 1.03, noise=0.005))
    assert r.outcome == "within_noise"
    assert r.pvalue < 0.01
    assert "within the 5% threshold" in r.detail


def test_large_but_insignificant_change_is_marked_with_a_tilde() -> None:
    rng = np.random.default_rng(5)
    r = compare_samples(_samples(rng, 6, noise=0.3), _samples(rng, 6, 1.2, noise=0.3))
    assert r.outcome == "within_noise"
    assert r.detail.startswith("~")


def test_too_few_samples_cannot_be_judged() -> None:
    assert min_attainable_p(3, 3) == pytest.approx(0.1)
    assert min_attainable_p(5, 5) < 0.01
    r = compare_samples([1.0, 1.01, 0.99], [2.0, 2.02, 1.98])
    assert r.outcome == "within_noise"
    assert "too few samples" in r.detail
    assert math.isnan(r.ci_low)


def test_bootstrap_is_seeded_and_covers_the_true_ratio() -> None:
    rng = np.random.default_rng(6)
    b, h = _samples(rng, 100), _samples(rng, 100, 1.07)
    assert bootstrap_ratio_ci(b, h, seed=7) == bootstrap_ratio_ci(b, h, seed=7)
    lo, hi = bootstrap_ratio_ci(b, h, level=0.99)
    assert lo < 1.07 < hi
    assert hi - lo < 0.02


def test_samples_must_be_positive() -> None:
    with pytest.raises(ValueError):
        compare_samples([1.0, -1.0], [1.0, 1.0])
    with pytest.raises(ValueError):
        compare_samples([], [1.0])


def test_summaries_alone_detect_a_regression_and_pass_noise() -> None:
    rng = np.random.default_rng(8)
    base = _timing(_samples(rng, 50)).model_copy(update={"samples_ms": []})
    slow = _timing(_samples(rng, 50, 1.10)).model_copy(update={"samples_ms": []})
    same = _timing(_samples(rng, 50)).model_copy(update={"samples_ms": []})
    r = compare_summaries(base, slow)
    assert r.outcome == "regression" and r.method == "summary"
    assert compare_summaries(base, same).outcome == "within_noise"


def test_correctness_failure_whatever_the_timing() -> None:
    rng = np.random.default_rng(9)
    base = _job(samples=_samples(rng, 30))
    for status in ("incorrect", "failed", "timeout", "oom"):
        head = _job(status=status, samples=_samples(rng, 30, 0.5))  # much faster, and wrong
        r = compare_jobs(base, head)
        assert r.outcome == "correctness_failure", status
        assert status in r.reason
    assert compare_jobs(None, _job(status="incorrect")).outcome == "correctness_failure"


def test_not_comparable_cases() -> None:
    rng = np.random.default_rng(10)
    ok = _job(samples=_samples(rng, 30))
    assert compare_jobs(ok, None).reason == "missing in head"
    assert compare_jobs(None, ok).outcome == "not_comparable"
    assert compare_jobs(_job(status="incorrect"), _job(status="failed")).outcome == "not_comparable"
    assert compare_jobs(ok, _job(status="unsupported")).outcome == "not_comparable"
    assert compare_jobs(_job(status="incorrect"), ok).outcome == "not_comparable"
    assert compare_jobs(ok, _job(samples=None)).reason == "no timing in head"
    other = compare_jobs(ok, ok, base_env=_env(), head_env=_env(machine_kind="a100"))
    assert other.outcome == "not_comparable" and "h200 vs a100" in other.reason


def _doc(jobs: list[JobResult], **env: object) -> ResultDocument:
    return ResultDocument(environment=_env(**env), jobs=jobs)


def test_documents_match_jobs_and_grade_each() -> None:
    rng = np.random.default_rng(11)
    base = _doc(
        [
            _job("a", samples=_samples(rng, 40)),
            _job("b", samples=_samples(rng, 40)),
            _job("c", samples=_samples(rng, 40)),
            _job("gone", samples=_samples(rng, 40)),
        ]
    )
    head = _doc(
        [
            _job("a", samples=_samples(rng, 40, 1.10)),
            _job("b", samples=_samples(rng, 40)),
            _job("c", status="incorrect"),
            _job("new", samples=_samples(rng, 40)),
        ],
        torch="2.13.1",  # a patch release stays comparable
    )
    cmp = compare_documents(base, head)
    got = {r.impl: r.outcome for r in cmp.rows}
    assert got == {
        "a": "regression",
        "b": "within_noise",
        "c": "correctness_failure",
        "new": "not_comparable",
        "gone": "not_comparable",
    }
    assert cmp.failed
    assert cmp.counts["regression"] == 1 and cmp.counts["not_comparable"] == 2
    d = cmp.to_dict()
    assert d["failed"] is True and len(d["rows"]) == 5


def test_major_software_change_is_not_comparable() -> None:
    rng = np.random.default_rng(12)
    base = _doc([_job(samples=_samples(rng, 40))])
    head = _doc([_job(samples=_samples(rng, 40, 1.5))], torch="2.14.0")
    cmp = compare_documents(base, head)
    assert [r.outcome for r in cmp.rows] == ["not_comparable"]
    assert not cmp.failed
    assert "torch 2.13 vs 2.14" in cmp.context_mismatch


def test_latest_attempt_wins() -> None:
    rng = np.random.default_rng(13)
    base = _doc([_job(samples=_samples(rng, 40))])
    head = _doc([_job(status="timeout", attempt=1), _job(samples=_samples(rng, 40), attempt=2)])
    assert [r.outcome for r in compare_documents(base, head).rows] == ["within_noise"]


def test_series_keys() -> None:
    assert major_minor("2.13.0+cu130") == "2.13"
    assert major_minor("3.11.9") == "3.11"
    assert major_minor("12") == "12.0"
    assert major_minor(None) is None
    job = _job()
    key = series_key(job, _env(triton="3.6.0", python="3.11.9"))
    assert key.key == ("gdn/triton_chunk/B8-T4096-H6-K128-V128/bf16/fwd@h200[python=3.11,torch=2.13,triton=3.6]")
    assert series_key(job, _env(triton="3.6.1", python="3.11.2")) == key
    assert series_key(job, _env(triton="3.7.0", python="3.11.9")) != key
    assert SeriesKey.from_dict(key.to_dict()) == key
    assert len(key.fingerprint) == 16
    assert job_key(job) == ("gdn", "triton_chunk", "B8-T4096-H6-K128-V128", "bf16", "fwd")
    assert context_mismatch(_env(), _env(torch="2.13.5")) is None


def _old_style_bootstrap(
    b: np.ndarray, h: np.ndarray, level: float, n_resamples: int, seed: int
) -> tuple[float, float]:
    """The textbook percentile bootstrap (gather the resampled values, take their medians): the reference."""
    rng = np.random.default_rng(seed)
    mb = np.median(b[rng.integers(0, b.size, (n_resamples, b.size))], axis=1)
    mh = np.median(h[rng.integers(0, h.size, (n_resamples, h.size))], axis=1)
    tail = (1.0 - level) / 2.0
    lo, hi = np.quantile(mh / mb, [tail, 1.0 - tail])
    return float(lo), float(hi)


def test_vectorised_bootstrap_matches_the_per_pair_and_the_textbook_intervals() -> None:
    rng = np.random.default_rng(14)
    sizes = [(20, 20), (20, 20), (35, 12), (20, 20), (9, 50), (35, 12), (101, 100)]
    pairs = [(_samples(rng, nb), _samples(rng, nh, 1.0 + 0.03 * i)) for i, (nb, nh) in enumerate(sizes)]
    batch = bootstrap_ratio_cis(pairs, level=0.99, seed=5)
    # Batched or alone: the very same interval (same seed, same resample indices).
    assert batch == [bootstrap_ratio_ci(b, h, level=0.99, seed=5) for b, h in pairs]
    for (b, h), (lo, hi) in zip(pairs, batch, strict=True):
        ref_lo, ref_hi = _old_style_bootstrap(b, h, 0.99, 20_000, seed=1)
        # Monte-Carlo noise of a 0.5% percentile from 2000 resamples: well under a quarter of the interval's width.
        tol = 0.25 * (ref_hi - ref_lo) + 1e-9
        assert abs(lo - ref_lo) < tol and abs(hi - ref_hi) < tol, (len(b), len(h), (lo, hi), (ref_lo, ref_hi))


def test_batched_rank_test_equals_scipy_auto_per_pair() -> None:
    from scipy.stats import mannwhitneyu

    rng = np.random.default_rng(15)
    pairs = [(_samples(rng, n), _samples(rng, n, 1.02)) for n in (5, 8, 9, 20, 20, 40)]
    pairs.append((np.round(_samples(rng, 30), 2), np.round(_samples(rng, 30), 2)))  # ties
    pairs.append(([1.0, 1.0], [1.0, 1.0, 1.0]))  # everything ties
    got = mann_whitney_ps(pairs)
    want = [float(mannwhitneyu(h, b, alternative="two-sided").pvalue) for b, h in pairs[:-1]] + [1.0]
    assert got == pytest.approx(want, rel=1e-12, abs=0.0)


def test_batched_grading_equals_one_by_one() -> None:
    rng = np.random.default_rng(16)
    pairs = [(_samples(rng, 30), _samples(rng, 30, s)) for s in (0.9, 1.0, 1.03, 1.1, 1.1)] + [([1.0, 1.1], [2.0])]
    assert compare_sample_pairs(pairs) == [compare_samples(b, h) for b, h in pairs]


def _plain_bootstrap(b: np.ndarray, h: np.ndarray, level: float, n_resamples: int, seed: int) -> tuple[float, float]:
    """bootstrap_ratio_ci's draws (one chunk) read the plain way: both sums gathered per resample, rows unsorted."""
    from deltabench.harness.stats import _resampled_median_positions

    rng = np.random.default_rng(seed)
    b_lo, b_hi = _resampled_median_positions(rng, b.size, n_resamples)
    h_lo, h_hi = _resampled_median_positions(rng, h.size, n_resamples)
    bs, hs = np.sort(b), np.sort(h)
    tail = (1.0 - level) / 2.0
    lo, hi = np.quantile((hs[h_lo] + hs[h_hi]) / (bs[b_lo] + bs[b_hi]), [tail, 1.0 - tail])
    return float(lo), float(hi)


def test_bootstrap_is_bit_for_bit_the_plain_reading_of_its_draws() -> None:
    # The distinct-pair sums and the rows sorted before np.quantile are shortcuts: the interval must not move.
    rng = np.random.default_rng(17)
    sizes = [(20, 20), (20, 20), (21, 19), (1, 2), (3, 3), (10, 11), (200, 150)]
    pairs = [(_samples(rng, nb), _samples(rng, nh, 1.0 + 0.02 * i)) for i, (nb, nh) in enumerate(sizes)]
    pairs.append((np.round(_samples(rng, 20), 2), np.round(_samples(rng, 20), 2)))  # ties
    for seed in (0, 3):
        got = bootstrap_ratio_cis(pairs, level=0.99, n_resamples=2000, seed=seed)
        assert got == [_plain_bootstrap(b, h, 0.99, 2000, seed) for b, h in pairs]


def test_ratios_are_the_plain_median_ratios() -> None:
    rng = np.random.default_rng(18)
    pairs = [(_samples(rng, nb), _samples(rng, nh, 1.05)) for nb, nh in [(20, 20), (20, 20), (7, 8), (1, 1), (9, 30)]]
    got = [r.ratio for r in compare_sample_pairs(pairs)]
    assert got == [float(np.median(h) / np.median(b)) for b, h in pairs]
