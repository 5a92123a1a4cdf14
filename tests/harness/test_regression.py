"""Regression detection: sample statistics, the run-to-run noise model, the grading rule and its reasons, job
outcomes, document matching (missing and incomplete heads), series."""

from __future__ import annotations

import types

import numpy as np
import pytest

from deltabench.harness.document import CaseSpec, Environment, JobResult, ResultDocument, TimingStats
from deltabench.harness.series import SeriesKey, context_mismatch, job_key, major_minor, series_key
from deltabench.regression import (
    GradingRule,
    RunSpread,
    compare_documents,
    compare_jobs,
    default_spread,
    spread_from_history,
)
from deltabench.regression.samples import (
    bootstrap_ratio_ci,
    bootstrap_ratio_cis,
    mann_whitney_ps,
    min_attainable_p,
)

# The accelerator default (1%): the within-run criteria decide these synthetic GPU-like samples.
ACC = default_spread("h200")


def compare_samples(b, h, spread: RunSpread = ACC, **rule: object) -> types.SimpleNamespace:
    """One pair graded, its outcome and evidence flattened (``r.outcome``, ``r.ratio``, ``r.detail``...)."""
    v = GradingRule(**rule).grade_samples([(b, h)], [spread])[0]  # type: ignore[arg-type]
    return types.SimpleNamespace(outcome=v.outcome, **v.evidence.model_dump())


def compare_sample_pairs(pairs, spread: RunSpread = ACC) -> list:
    return GradingRule().grade_samples(pairs, [spread] * len(pairs))


def compare_summaries(base: TimingStats, head: TimingStats, spread: RunSpread = ACC) -> types.SimpleNamespace:
    v = GradingRule().grade_summaries(base, head, spread)
    return types.SimpleNamespace(outcome=v.outcome, **v.evidence.model_dump())


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
        sem_rel=float(1.2533 * s.std(ddof=1) / np.sqrt(s.size) / np.median(s)),
    )


def _env(**kw: object) -> Environment:
    base = {"host": "gpu-01", "machine_kind": "h200", "device_name": "NVIDIA H200", "torch": "2.13.0+cu130"}
    base.update(kw)
    return Environment(**base)  # type: ignore[arg-type]


def _job(impl: str = "triton_chunk", status: str = "ok", samples=None, attempt: int = 1, T: int = 4096) -> JobResult:
    case = CaseSpec(op="gdn", B=8, T=T, H=6, K=128, V=128, dtype="bf16", mode="fwd")
    timing = _timing(samples) if samples is not None else None
    fields = {"case": case, "impl": impl, "status": status, "timing": timing, "attempt": attempt, "reason": ""}
    if (status == "ok") != (timing is not None):
        # A document today's validation refuses (a failed job with a timing, an ok job without one), as older
        # versions stored them: the comparison must still grade it.
        return JobResult.model_construct(**fields)
    return JobResult(**fields)


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
    assert r.ci_low is None


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
    assert d["failed"] is True and len(d["rows"]) == 5 and d["missing_in_head"] == 1


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
    one_by_one = [GradingRule().grade_samples([p], [ACC])[0] for p in pairs]
    assert compare_sample_pairs(pairs) == one_by_one


def _plain_bootstrap(b: np.ndarray, h: np.ndarray, level: float, n_resamples: int, seed: int) -> tuple[float, float]:
    """bootstrap_ratio_ci's draws (one chunk) read the plain way: both sums gathered per resample, rows unsorted."""
    from deltabench.regression.samples import _resampled_median_positions

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
    got = [r.evidence.ratio for r in compare_sample_pairs(pairs)]
    assert got == [float(np.median(h) / np.median(b)) for b, h in pairs]


# ------------------------------------------------------------------------------------------ run-to-run noise


def _run(rng: np.random.Generator, scale: float, run_sigma: float, n: int = 30) -> np.ndarray:
    """One run's samples: tight within the run (0.5%), its level moved by a run effect of `run_sigma`."""
    return _samples(rng, n, scale * np.exp(rng.normal(0.0, run_sigma)), noise=0.005)


def test_spread_from_history_needs_five_runs_and_measures_the_log_spread() -> None:
    levels = [1.0, 1.02, 0.98, 1.01, 0.99]
    assert spread_from_history(levels[:4]) is None
    s = spread_from_history(levels)
    assert s is not None and s.source == "history" and s.runs == 5
    assert s.sigma == pytest.approx(float(np.std(np.log(levels), ddof=1)))
    assert s.center_ms == pytest.approx(float(np.exp(np.mean(np.log(levels)))))
    # Student-t prediction bound: t(0.99; 4) * s * sqrt(1 + 1/5)
    assert s.bound(0.01) == pytest.approx(3.7469 * s.sigma * np.sqrt(1.2), rel=1e-3)
    assert spread_from_history([1.0] * 5).sigma == 0.001  # a floor, never zero


def test_pooled_histories_widen_the_bound_only_for_heavy_tails() -> None:
    from deltabench.regression import spreads_from_histories

    rng = np.random.default_rng(25)
    normal = {i: np.exp(rng.normal(0.0, 0.02, 5)).tolist() for i in range(40)}
    calm = spreads_from_histories(normal)
    assert len(calm) == 40 and all(s.tail < 1.3 for s in calm.values())  # at most the estimate's own noise
    # The same machine with one run in ten far off (a job's best time 3x): every job's bound is widened together.
    heavy = {i: [v * (3.0 if rng.random() < 0.1 else 1.0) for v in lv] for i, lv in normal.items()}
    wide = spreads_from_histories(heavy)
    tails = {s.tail for s in wide.values()}
    assert len(tails) == 1 and tails.pop() > 1.6
    assert "widened" in next(iter(wide.values())).describe()
    # Too few residuals to judge a tail (two jobs): the bounds stay as they are.
    assert all(s.tail == 1.0 for s in spreads_from_histories({0: heavy[0], 1: heavy[1]}).values())


def test_history_is_cut_at_its_last_change_point() -> None:
    rng = np.random.default_rng(20)
    before = (1.0 * np.exp(rng.normal(0, 0.01, 12))).tolist()
    after = (1.5 * np.exp(rng.normal(0, 0.01, 8))).tolist()
    s = spread_from_history(before + after)
    assert s is not None and s.runs == 8 and s.sigma < 0.03 and 1.45 < s.center_ms < 1.55


def test_run_effects_do_not_fail_unchanged_code_when_the_history_knows_them() -> None:
    # Runs of unchanged code, each run's level moved by ~5%: samples within a run are tight, so the within-run test
    # alone calls most pairs significant; the history's spread keeps them from failing.
    rng = np.random.default_rng(21)
    failures = within_only = 0
    for _ in range(100):
        history = [_run(rng, 1.0, 0.05) for _ in range(6)]
        base, head = history[-1], _run(rng, 1.0, 0.05)
        spread = spread_from_history([float(np.median(h)) for h in history])
        r = compare_samples(base, head, spread=spread, n_resamples=500)
        failures += r.outcome == "regression"
        within_only += r.pvalue < 0.01 and r.ratio > 1.05 and r.ci_low > 1.0
    assert failures <= 2  # at most alpha = 1% in expectation
    assert within_only >= 15  # the old within-run rule would have failed these


def test_a_real_slowdown_beyond_the_history_spread_is_caught_with_the_reason() -> None:
    rng = np.random.default_rng(22)
    history = [_run(rng, 1.0, 0.01) for _ in range(6)]
    spread = spread_from_history([float(np.median(h)) for h in history])
    r = compare_samples(history[-1], _run(rng, 1.10, 0.01), spread=spread)
    assert r.outcome == "regression"
    assert "beyond run-to-run noise" in r.detail and "6 past runs" in r.detail
    assert r.spread_source == "history" and r.history_runs == 6 and r.noise_bound < 0.08


def test_no_history_says_the_spread_is_unknown_and_still_catches_a_large_slowdown() -> None:
    rng = np.random.default_rng(23)
    cpu = default_spread("cpu")
    moderate = compare_samples(_run(rng, 1.0, 0.0), _run(rng, 1.12, 0.0), spread=cpu)
    assert moderate.outcome == "within_noise"
    assert moderate.detail.startswith("within noise: run-to-run spread unknown")
    large = compare_samples(_run(rng, 1.0, 0.0), _run(rng, 20.0, 0.0), spread=cpu)  # beyond e^(3.29 * 0.78) = 13x
    assert large.outcome == "regression" and "base run" in large.detail


def test_each_reason_names_the_criterion_that_decided() -> None:
    rule = GradingRule(threshold=0.05, alpha=0.01)
    hist = RunSpread(sigma=0.02, source="history", runs=6, center_ms=1.0)
    assert "within the 5% threshold" in rule.decide(change=0.03, pvalue=1e-9, ci=(1.02, 1.04), spread=hist)[1]
    assert "not significant" in rule.decide(change=0.2, pvalue=0.2, ci=(0.9, 1.5), spread=hist)[1]
    # The old rule said "significant but within the threshold" here; the interval holding 1 is the reason.
    assert "holds 1" in rule.decide(change=1.28, pvalue=1e-4, ci=(0.97, 3.1), spread=hist)[1]
    assert "within run-to-run noise" in rule.decide(change=0.07, pvalue=1e-9, ci=(1.05, 1.09), spread=hist)[1]
    # Best time 9% faster while the medians got slower: neither a regression nor an improvement, and said so.
    assert "the other way" in rule.decide(change=-0.09, pvalue=1e-9, ci=(1.5, 3.7), spread=hist)[1]
    outcome, why = rule.decide(change=-0.3, pvalue=1e-9, ci=(0.6, 0.8), spread=hist)
    assert outcome == "improvement" and "-30.0%" in why


def test_a_head_missing_base_jobs_or_cut_short_fails_unless_allowed() -> None:
    rng = np.random.default_rng(24)
    base = _doc([_job("a", samples=_samples(rng, 40)), _job("b", samples=_samples(rng, 40))])
    head = _doc([_job("a", samples=_samples(rng, 40))])
    cmp = compare_documents(base, head)
    assert cmp.missing_in_head == 1 and cmp.failed
    assert not compare_documents(base, head, allow_missing=True).failed
    whole = _doc([_job("a", samples=_samples(rng, 40)), _job("b", samples=_samples(rng, 40))])
    assert not compare_documents(base, whole).failed
    cut = whole.model_copy(update={"meta": {"complete": False}})
    cmp = compare_documents(base, cut)
    assert cmp.head_incomplete and cmp.failed
    assert not compare_documents(base, cut, allow_missing=True).failed


def _repeated(rng: np.random.Generator, levels: list[float], n: int = 30) -> tuple[list[float], list[int]]:
    """Samples of one job in len(levels) repetitions (worker processes), each at its own level: 1% noise above it."""
    samples, reps = [], []
    for r, level in enumerate(levels):
        samples += (level * np.exp(np.abs(rng.normal(0.0, 0.01, n)))).tolist()
        reps += [r] * n
    return samples, reps


def test_spread_from_repetitions_keeps_each_runs_faster_half_and_needs_five_a_side() -> None:
    from deltabench.regression.noise import MIN_REPETITIONS, spread_from_repetitions

    base, head = [1.0, 1.1, 0.95, 1.4, 1.02], [1.3, 1.2, 1.25, 1.4, 1.6, 1.22]
    s = spread_from_repetitions(base, head)
    assert s is not None and s.source == "repetitions" and (s.runs, s.head_runs) == (5, 6)
    fast_b, fast_h = np.log([0.95, 1.0, 1.02]), np.log([1.2, 1.22, 1.25])  # the ceil(n/2) fastest of each
    assert s.center_ms == pytest.approx(np.exp(fast_b.mean())) and s.head_center_ms == pytest.approx(
        np.exp(fast_h.mean())
    )
    assert s.sigma == pytest.approx(np.sqrt(fast_b.var(ddof=1) / 3 + fast_h.var(ddof=1) / 3))
    assert s.base_logs == tuple(np.log(base).tolist()) and s.head_logs == tuple(np.log(head).tolist())
    assert MIN_REPETITIONS == 5
    assert spread_from_repetitions(base[:4], head) is None
    assert spread_from_repetitions(base, head[:4]) is None


def test_the_permutation_null_covers_every_split_and_its_bound_holds_the_level() -> None:
    """The null against the statistic recomputed over every split, and the bound crossed by at most `level` of the
    splits in each direction, for equal and unequal sizes; beyond EXACT_SPLITS, random splits with the observed
    one among them."""
    import itertools

    from deltabench.regression.noise import (
        EXACT_SPLITS,
        permutation_bound,
        permutation_null,
        studentised_difference,
    )

    rng = np.random.default_rng(40)
    for nb, nh in ((5, 5), (5, 7), (6, 5)):
        yb, yh = rng.normal(0, 0.1, nb), rng.normal(0.05, 0.2, nh)
        y = np.concatenate([yb, yh])
        stats = []
        for b in itertools.combinations(range(nb + nh), nb):
            h = [i for i in range(nb + nh) if i not in b]
            d, se = studentised_difference(y[list(b)][None], y[h][None])
            stats.append(float(d[0] / se[0]))
        null = permutation_null(tuple(yb.tolist()), tuple(yh.tolist()))
        assert np.allclose(null, sorted(stats))
        _, se_obs = studentised_difference(yb, yh)
        for level in (0.004, 0.01, 0.05, 0.2):
            q = permutation_bound(tuple(yb.tolist()), tuple(yh.tolist()), level) / float(se_obs)
            assert np.mean(null > q + 1e-9) <= level and np.mean(null < -q - 1e-9) <= level
    big = permutation_null(tuple(rng.normal(size=10).tolist()), tuple(rng.normal(size=10).tolist()))
    assert big.size == EXACT_SPLITS < 184_756  # C(20, 10) splits: a seeded sample of them


def test_the_rule_takes_history_then_repetitions_then_the_default() -> None:
    """In order: a history decides when there is one; else the repetitions of both runs; else the machine class's
    default, which on the CPU (78%) cannot see a 30% slowdown, while 8 repetitions a side can, even when some of
    them sit in a slow process state (the faster half decides)."""
    rng = np.random.default_rng(31)
    cpu = default_spread("cpu")
    base = _repeated(rng, [1.00, 1.02, 1.45, 0.99, 1.0, 1.6, 1.01, 1.0])
    head = _repeated(rng, [1.31, 1.9, 1.29, 1.33, 1.3, 1.3, 2.0, 1.32])
    rule = GradingRule()

    def grade(spread: RunSpread, b=base, h=head):
        return rule.grade_samples([(b[0], h[0])], [spread], [(b[1], h[1])])[0]

    v = grade(cpu)
    assert v.outcome == "regression", v.reason
    ev = v.evidence
    assert ev.spread_source == "repetitions" and (ev.base_repetitions, ev.head_repetitions) == (8, 8)
    assert "between repetitions (8 base, 8 head; no history;" in v.reason
    assert "faster half of 8 vs 8 repetitions" in v.reason
    fast_b = np.exp(np.mean(np.log(sorted(_levels_of(base))[:4])))
    fast_h = np.exp(np.mean(np.log(sorted(_levels_of(head))[:4])))
    assert ev.change == pytest.approx(fast_h / fast_b - 1) and ev.reference_ms == pytest.approx(fast_b)
    # A history wins over the repetitions: here one that says this job moves 30% between runs.
    hist = RunSpread(sigma=0.3, source="history", runs=6, center_ms=1.0)
    v = grade(hist)
    assert v.evidence.spread_source == "history" and v.outcome == "within_noise"
    assert "over 6 past runs" in v.reason
    # Unless the two runs were interleaved in one invocation: the base then saw the head's machine states, the
    # history's runs did not, so the repetitions decide, and the reason says the runs were interleaved.
    v = rule.grade_samples([(base[0], head[0])], [hist], [(base[1], head[1])], interleaved=True)[0]
    assert v.outcome == "regression" and v.evidence.spread_source == "repetitions"
    assert "vs the interleaved base's repetitions" in v.reason and "interleaved in one invocation (8 base" in v.reason
    # Four repetitions a side are too few: the default decides, and says the spread is unknown.
    four_b = ([x for x, r in zip(*base, strict=True) if r < 4], [r for r in base[1] if r < 4])
    four_h = ([x for x, r in zip(*head, strict=True) if r < 4], [r for r in head[1] if r < 4])
    v = grade(cpu, four_b, four_h)
    assert v.evidence.spread_source == "default" and v.outcome == "within_noise"
    assert v.reason.startswith("within noise: run-to-run spread unknown")
    # Repetitions that interleave with the change: within the run-to-run noise they show.
    wide_b = _repeated(rng, [1.0, 1.4, 0.8, 1.2, 1.1])
    wide_h = _repeated(rng, [1.3, 0.9, 1.6, 0.85, 1.2])
    v = grade(cpu, wide_b, wide_h)
    assert v.outcome != "regression" and v.evidence.spread_source == "repetitions"


def test_jobs_judged_on_repetitions_share_alpha() -> None:
    """Bonferroni over the jobs a comparison judges on repetitions: with 5 a side, the most extreme split has
    probability 1/252 = 0.004, enough for one job at alpha 0.01, not for each of three (0.0033)."""
    rng = np.random.default_rng(32)
    base = _repeated(rng, [1.0, 1.01, 1.02, 1.0, 1.01])
    head = _repeated(rng, [1.5, 1.52, 1.51, 1.5, 1.53])
    rule = GradingRule()
    one = rule.grade_samples([(base[0], head[0])], [default_spread("cpu")], [(base[1], head[1])])
    assert one[0].outcome == "regression"
    three = rule.grade_samples([(base[0], head[0])] * 3, [default_spread("cpu")] * 3, [(base[1], head[1])] * 3)
    assert all(v.outcome == "within_noise" for v in three)
    assert "bound at alpha/3 over 3 jobs" in three[0].reason


def _levels_of(run: tuple[list[float], list[int]]) -> list[float]:
    from deltabench.regression.noise import repetition_levels

    return repetition_levels(*run)


def test_a_run_level_of_repetitions_is_the_median_of_their_best_samples() -> None:
    from deltabench.regression.noise import repetition_levels, run_level

    samples = [3.0, 2.0, 9.0, 5.0, 4.0, 1.5]
    reps = [0, 0, 1, 1, 2, 2]
    assert repetition_levels(samples, reps) == [2.0, 5.0, 1.5]
    assert run_level(samples, 99.0, reps) == 2.0
    assert run_level(samples, 99.0) == 1.5  # one repetition: its best sample
    assert run_level([], 99.0) == 99.0


def test_repetition_indices_must_match_the_samples() -> None:
    from pydantic import ValidationError

    t = _timing([1.0, 2.0, 3.0])
    with pytest.raises(ValidationError, match="repetitions names 2 samples"):
        TimingStats(**{**t.model_dump(), "repetitions": [0, 1]})
    with pytest.raises(ValidationError, match="non-negative"):
        TimingStats(**{**t.model_dump(), "repetitions": [0, -1, 1]})
    assert TimingStats(**{**t.model_dump(), "repetitions": [0, 1, 1]}).n_repetitions == 2
    assert t.n_repetitions == 1


def test_runs_count_as_interleaved_only_when_each_names_the_other() -> None:
    from types import SimpleNamespace

    from deltabench.regression.matching import interleaved

    def run(run_id: str, other: str | None) -> SimpleNamespace:
        return SimpleNamespace(run_id=run_id, meta={"interleaved_with": other} if other else {})

    assert interleaved(run("b", "h"), run("h", "b"))
    assert not interleaved(run("b", "h"), run("h", None))  # a head from another invocation
    assert not interleaved(run("b", "x"), run("h", "b"))
    assert not interleaved(SimpleNamespace(run_id="b", jobs=[]), run("h", "b"))  # a run without meta (the store)
