"""Change points of a series' history: found where a step happened, with its size and significance; noise and
outliers alone raise none."""

from __future__ import annotations

import numpy as np
import pytest

from deltabench.regression.changepoints import find_change_points, point_values, robust_noise


def _history(rng: np.random.Generator, n: int, noise: float = 0.01, outliers: float = 0.0) -> np.ndarray:
    x = np.exp(rng.normal(0.0, noise, n))
    out = rng.random(n) < outliers
    x[out] *= 1.0 + rng.uniform(0.1, 0.5, out.sum())
    return x


def test_a_five_percent_step_is_found_where_it_happened() -> None:
    rng = np.random.default_rng(0)
    v = 2.0 * _history(rng, 100)
    v[60:] *= 1.05
    cps = find_change_points([(f"c{i}", x) for i, x in enumerate(v)])
    assert len(cps) == 1
    cp = cps[0]
    assert abs(cp.index - 60) <= 1
    assert cp.x == f"c{cp.index}"
    assert cp.ratio == pytest.approx(1.05, abs=0.01)
    assert cp.direction == "slower"
    assert cp.pvalue < 1e-6
    assert cp.n_before + cp.n_after == 100
    assert cp.to_dict()["ratio"] == pytest.approx(cp.ratio)


def test_two_steps_each_with_its_direction() -> None:
    rng = np.random.default_rng(1)
    v = _history(rng, 120)
    v[40:] *= 1.10
    v[80:] *= 0.85
    cps = find_change_points(list(enumerate(v)))
    assert [c.direction for c in cps] == ["slower", "faster"]
    assert [abs(c.index - t) <= 1 for c, t in zip(cps, (40, 80), strict=True)] == [True, True]


def test_noise_and_outliers_alone_raise_no_change_point() -> None:
    rng = np.random.default_rng(2)
    false = sum(len(find_change_points(list(enumerate(_history(rng, 100, outliers=0.03))))) for _ in range(100))
    assert false <= 2


def test_a_lone_outlier_is_not_a_change_point() -> None:
    v = np.ones(50) + np.random.default_rng(3).normal(0, 0.005, 50)
    v[25] *= 1.8
    assert find_change_points(list(enumerate(v))) == []


def test_points_may_carry_raw_samples() -> None:
    rng = np.random.default_rng(4)
    pts = [(i, list(_history(rng, 9, 0.02) * (1.2 if i >= 20 else 1.0))) for i in range(40)]
    cps = find_change_points(pts)
    assert len(cps) == 1 and cps[0].index == 20
    xs, vals = point_values(pts)
    assert xs == list(range(40)) and vals.shape == (40,)


def test_min_change_and_short_histories() -> None:
    rng = np.random.default_rng(5)
    v = _history(rng, 80, noise=0.002)
    v[40:] *= 1.02
    assert len(find_change_points(list(enumerate(v)))) == 1
    assert find_change_points(list(enumerate(v)), min_change=0.05) == []
    assert find_change_points([(0, 1.0), (1, 2.0), (2, 2.0)]) == []


def test_constant_history_and_bad_values() -> None:
    assert find_change_points([(i, 1.0) for i in range(30)]) == []
    assert robust_noise(np.zeros(30)) > 0
    with pytest.raises(ValueError):
        find_change_points([(0, 1.0), (1, -1.0)] * 5)


def test_otava_finds_the_step_and_a_later_run_confirms_it() -> None:
    """The dashboard's detector (Apache Otava): the step where it happened; with only the step's own run after it,
    the change point is not confirmed (the dashboard does not call it a regression yet); one run later it is."""
    from deltabench.regression.changepoints import DASHBOARD_DETECTOR, dashboard_change_points, find_change_points_otava

    rng = np.random.default_rng(0)
    v = 2.0 * _history(rng, 60)
    v[40:] *= 1.10
    (cp,) = find_change_points_otava([(f"c{i}", x) for i, x in enumerate(v)])
    assert abs(cp.index - 40) <= 1 and cp.ratio == pytest.approx(1.10, abs=0.02) and cp.pvalue < 1e-3
    assert cp.confirmed and cp.to_dict()["confirmed"] is True
    assert DASHBOARD_DETECTOR == "otava"
    assert [c.index for c in dashboard_change_points([(i, x) for i, x in enumerate(v)])] == [cp.index]
    # The step's own run alone after it: not confirmed; a second run at the new level confirms it.
    from deltabench.regression.changepoints import ChangePoint

    one = ChangePoint(index=40, x=40, before=2.0, after=2.2, pvalue=1e-5, n_before=40, n_after=1)
    assert not one.confirmed and ChangePoint(**{**one.__dict__, "n_after": 2}).confirmed


def test_the_segments_welch_test_gives_scipys_p_values_to_the_bit() -> None:
    """The change points' Welch test is written out for speed; it must stay scipy's ``ttest_ind`` exactly
    (equal_var=False), on noisy logs, small steps, coarse values and a constant side."""
    from scipy.stats import ttest_ind

    from deltabench.regression.changepoints import _welch_p

    rng = np.random.default_rng(5)
    for trial in range(2000):
        na, nb = (int(n) for n in rng.integers(2, 40, 2))
        if trial % 3 == 0:
            a, b = rng.normal(0.0, 1.0, na), rng.normal(rng.normal(0.0, 0.5), rng.uniform(0.1, 3.0), nb)
        elif trial % 3 == 1:
            a = np.log(1.3 * np.exp(rng.normal(0.0, 0.01, na)))
            b = np.log(1.3 * 1.08 * np.exp(rng.normal(0.0, 0.01, nb)))
        else:
            a, b = np.round(rng.normal(0.0, 1.0, na), 1), np.full(nb, 0.5)
        if np.ptp(a) == 0.0 and np.ptp(b) == 0.0:
            continue
        assert _welch_p(a, b) == float(ttest_ind(a, b, equal_var=False).pvalue), (trial, a, b)
    assert _welch_p(np.array([1.0, 1.0]), np.array([2.0, 2.0])) == 0.0
    assert _welch_p(np.array([1.0]), np.array([2.0, 3.0])) == 1.0


def test_the_written_out_medians_are_numpys_to_the_bit() -> None:
    """The segmentation's medians skip ``np.median``'s generic reduction for speed; they must stay its values
    exactly: odd and even counts, ties, coarse values, and the running median of 5 at any length."""
    from deltabench.regression.changepoints import _MEDIAN_WINDOW, _median, _running_median

    rng = np.random.default_rng(11)
    for trial in range(3000):
        n = int(rng.integers(1, 60))
        a = rng.normal(0.0, 1.0, n) if trial % 2 else np.round(rng.normal(0.0, 1.0, n), 1)
        assert _median(a) == float(np.median(a)), (trial, a)
        y = np.log(np.exp(rng.normal(0.0, 0.01, n)) * (1.0 + (rng.random(n) < 0.1)))
        half = _MEDIAN_WINDOW // 2
        windows = np.lib.stride_tricks.sliding_window_view(np.pad(y, half, mode="edge"), _MEDIAN_WINDOW)
        assert np.array_equal(_running_median(y, _MEDIAN_WINDOW), np.median(windows, axis=1)), (trial, y)


def test_change_points_of_values_are_find_change_points_of_the_same_points() -> None:
    from deltabench.regression.changepoints import change_points_of_values

    rng = np.random.default_rng(2)
    for n in (5, 6, 31, 32, 100):
        v = _history(rng, n, outliers=0.05)
        v[n // 2 :] *= 1.1
        assert change_points_of_values(range(n), v) == find_change_points(list(enumerate(v.tolist())))
