"""web/charts.py: the figures the run and compare pages draw, built from documents and comparisons."""

from __future__ import annotations

import json

import pytest

from deltabench.harness.document import WorkFigures
from deltabench.regression import GradingRule, compare_documents
from deltabench.web import charts

CEILINGS = {"matmul_tflops": 2.0, "copy_gbps": 50.0, "matmul_dtype_bits": 32.0}


def _job(build, impl: str, mode: str, T: int, median: float, **kw):  # type: ignore[no-untyped-def]
    """A job whose work figures follow from its median (flops and bytes grow with T)."""
    job = build.job(impl=impl, mode=mode, T=T, median=median, **kw)
    if job.status == "ok":
        flops, nbytes = 4e6 * T, 1e5 * T
        s = median / 1e3
        job.work = WorkFigures(flops=flops, bytes=nbytes, tflops=flops / s / 1e12, gbps=nbytes / s / 1e9)
    return job


MEDIANS = {"torch_chunk": 2.0, "triton_chunk": 1.0, "jax_chunk": 4.0}


@pytest.fixture
def doc(build):  # type: ignore[no-untyped-def]
    """gdn: three impls x fwd, fwd+bwd x two shapes (torch_chunk the baseline), an incorrect job, a retried job."""
    jobs = [
        _job(build, impl, mode, T, median * (3 if mode == "fwd+bwd" else 1) * T / 64)
        for impl, median in MEDIANS.items()
        for mode in ("fwd", "fwd+bwd")
        for T in (64, 256)
    ]
    jobs.append(_job(build, "jax_chunk", "fwd", 1000, 1.0, status="incorrect"))
    retried = jobs[0].model_copy(update={"attempt": 2})
    retried.timing = retried.timing.model_copy(update={"median_ms": 1.5, "q1_ms": 1.4, "q3_ms": 1.7})  # type: ignore[union-attr]
    jobs.append(retried)
    return build.document(jobs=jobs).model_copy(update={"ceilings": CEILINGS})


def _trace(fig, name: str, **where):  # type: ignore[no-untyped-def]
    found = [t for t in fig["data"] if t["name"] == name and all(t.get(k) == v for k, v in where.items())]
    assert len(found) == 1, (name, where, [t["name"] for t in fig["data"]])
    return found[0]


def test_bars_put_impls_side_by_side_per_shape_with_iqr_whiskers_per_mode(doc) -> None:  # type: ignore[no-untyped-def]
    (fig,) = charts.op_bar_figures(doc)
    assert fig["id"] == "chart-bars-gdn" and fig["op"] == "gdn"
    assert len(fig["data"]) == 3 * 2, "a bar trace per impl and mode"
    assert {t["type"] for t in fig["data"]} == {"bar"} and fig["layout"]["barmode"] == "group"
    # fwd in the first panel, fwd+bwd in the second, each titled.
    assert [a["text"] for a in fig["layout"]["annotations"]] == ["fwd", "fwd+bwd"]
    fwd = _trace(fig, "triton_chunk", xaxis="x")
    bwd = _trace(fig, "triton_chunk", xaxis="x2")
    assert fwd["x"] == ["B2-T64-H4-K64-V64 bf16", "B2-T256-H4-K64-V64 bf16"]
    assert fwd["y"] == [1.0, 4.0] and bwd["y"] == [3.0, 12.0]
    # The whiskers are the IQR: q3 - median above, median - q1 below (make_job: q1 = 0.995 m, q3 = 1.005 m).
    assert fwd["error_y"]["array"] == pytest.approx([0.005, 0.02])
    assert fwd["error_y"]["arrayminus"] == pytest.approx([0.005, 0.02])
    # The retried job's later attempt replaces the first; the incorrect job is not drawn.
    torch_fwd = _trace(fig, "torch_chunk", xaxis="x")
    assert torch_fwd["y"][0] == 1.5 and torch_fwd["error_y"]["array"][0] == pytest.approx(0.2)
    assert all("B2-T1000" not in x for t in fig["data"] for x in t["x"])
    # One legend entry per impl, one colour per impl across panels.
    assert [t["name"] for t in fig["data"] if t["showlegend"]] == list(MEDIANS)
    assert fwd["marker"]["color"] == bwd["marker"]["color"] != torch_fwd["marker"]["color"]
    assert fig["layout"]["yaxis"]["title"]["text"] == "median ms (CPU)"
    assert fig["layout"]["yaxis2"]["title"]["text"] == "median ms (CPU)"


def test_roofline_places_each_job_at_its_intensity_under_the_ceilings(doc) -> None:  # type: ignore[no-untyped-def]
    fig = charts.roofline_figure(doc)
    assert fig is not None and fig["id"] == "chart-roofline"
    points = _trace(fig, "jax_chunk")
    assert len(points["x"]) == 4 and points["x"] == pytest.approx([4e6 / 1e5] * 4), "FLOP per byte"
    # jax_chunk fwd at T=64: 4e6*64 FLOP in 4 ms.
    assert points["y"][0] == pytest.approx(4e6 * 64 / 4e-3 / 1e12)
    copy = _trace(fig, "copy ceiling 50 GB/s")
    matmul = _trace(fig, "matmul ceiling 2 TFLOP/s")
    ridge = 1e3 * 2.0 / 50.0
    assert copy["x"][1] == matmul["x"][0] == pytest.approx(ridge)
    assert copy["y"][1] == matmul["y"][0] == matmul["y"][1] == 2.0
    assert copy["y"][0] == pytest.approx(50.0 * copy["x"][0] / 1e3), "the copy roof is bandwidth x intensity"
    assert fig["layout"]["xaxis"]["title"]["text"] == "arithmetic intensity (FLOP/byte)"
    assert fig["layout"]["yaxis"]["title"]["text"] == "achieved TFLOP/s"
    assert fig["layout"]["xaxis"]["type"] == fig["layout"]["yaxis"]["type"] == "log"
    assert "GB/s" in points["hovertemplate"]
    assert points["customdata"][0][1] == pytest.approx(1e5 * 64 / 4e-3 / 1e9), "GB/s in the hover"
    assert points["customdata"][0][2] == "floor unknown", "no % of floor is shown as 0%"


def test_roofline_without_ceilings_or_work(doc, build) -> None:  # type: ignore[no-untyped-def]
    bare = charts.roofline_figure(doc.model_copy(update={"ceilings": {}}))
    assert bare is not None and "ceilings not measured" in bare["title"]
    assert [t["name"] for t in bare["data"]] == list(MEDIANS)
    no_work = build.document(jobs=[build.job(status="incorrect")])
    assert charts.roofline_figure(no_work) is None


def test_speedup_is_baseline_over_impl_across_shapes(doc) -> None:  # type: ignore[no-untyped-def]
    (fig,) = charts.speedup_figures(doc)
    assert fig["id"] == "chart-speedup-gdn"
    names = [t["name"] for t in fig["data"]]
    assert names == ["triton_chunk", "jax_chunk", "torch_chunk (baseline, 1×)"]
    triton = _trace(fig, "triton_chunk")
    assert triton["x"][:2] == ["B2-T64-H4-K64-V64 bf16 fwd", "B2-T256-H4-K64-V64 bf16 fwd"]
    # The retried baseline (1.5 ms) is what the speedup divides at T=64 fwd: result_rows reads the last attempt.
    assert triton["y"] == pytest.approx([1.5, 2.0, 2.0, 2.0])
    assert _trace(fig, "jax_chunk")["y"] == pytest.approx([1.5 / 4, 0.5, 0.5, 0.5])
    assert set(fig["data"][-1]["y"]) == {1.0}
    assert fig["layout"]["yaxis"]["title"]["text"] == "speedup vs torch_chunk (×, log scale)"


def test_speedup_axis_labels_decades_not_minor_ticks(build) -> None:  # type: ignore[no-untyped-def]
    """A speedup of 37x: ticks 1x, 10x, 100x and the axis reaching 100x (plotly labelled 2..6 above 10 and no
    100); a span within a decade: 1-2-5 ticks around the data."""
    jobs = [build.job(impl="torch_chunk", median=37.0), build.job(impl="triton_chunk", median=1.0)]
    (fig,) = charts.speedup_figures(build.document(jobs=jobs))
    axis = fig["layout"]["yaxis"]
    assert (axis["tickvals"], axis["ticktext"]) == ([1.0, 10.0, 100.0], ["1×", "10×", "100×"])
    assert axis["range"][0] <= 0 and axis["range"][1] >= 2  # log10: 1x to 100x
    assert charts.log_ticks(0.5, 3.0) == [0.5, 1.0, 2.0, 5.0]
    assert charts.log_ticks(0.004, 1.0) == [0.001, 0.01, 0.1, 1.0]


def test_ratio_figure_draws_each_rows_interval_coloured_by_outcome(build) -> None:  # type: ignore[no-untyped-def]
    base = build.document(jobs=[build.job(impl=i, median=1.0, n=40) for i in ("torch_chunk", "triton_chunk")])
    head = build.document(
        jobs=[build.job(impl="torch_chunk", median=1.3, n=40), build.job(impl="triton_chunk", median=1.0, n=40)]
    )
    # A known 1% run-to-run spread (as a series' history would give), so the 30% step grades as a regression.
    comparison = compare_documents(base, head, rule=GradingRule(threshold=0.05, alpha=0.01), default_sigma=0.01)
    public = comparison.model_copy(update={"base_label": "base", "head_label": "head"})
    fig = charts.ratio_figure(public)
    assert fig is not None and fig["id"] == "chart-ratios"
    by_outcome = {t["name"]: t for t in fig["data"]}
    assert set(by_outcome) == {"regression", "within noise"}
    slow = by_outcome["regression"]
    row = next(r for r in public.rows if r.outcome == "regression")
    assert slow["x"] == [pytest.approx(row.stats.ratio)] and slow["x"][0] > 1.2
    assert slow["x"][0] + slow["error_x"]["array"][0] == pytest.approx(row.stats.ci_high)
    assert slow["x"][0] - slow["error_x"]["arrayminus"][0] == pytest.approx(row.stats.ci_low)
    assert slow["y"] == ["gdn · torch_chunk · B2-T1024-H4-K64-V64 bf16 fwd"]
    assert slow["marker"]["color"] == charts.OUTCOME_COLORS["regression"]
    assert sorted(s["x0"] for s in fig["layout"]["shapes"]) == pytest.approx([0.95, 1.0, 1.05])
    assert "ratio" in fig["layout"]["xaxis"]["title"]["text"]
    # A comparison without statistics (nothing matched) has no chart.
    lone = compare_documents(base, build.document(jobs=[build.job(impl="other")]))
    assert charts.ratio_figure(lone) is None


def test_figures_are_strict_json_and_escape_stored_names(doc, build) -> None:  # type: ignore[no-untyped-def]
    nasty = "<b>x</b>%{y}"
    doc.jobs.append(_job(build, nasty, "fwd", 64, 1.0))
    doc.jobs.append(_job(build, "inf_impl", "fwd", 64, 1.0).model_copy(update={"work": None}))
    doc.jobs[-1].timing.median_ms = float("inf")  # type: ignore[union-attr]
    figures = charts.run_figures(doc)
    assert [f["id"] for f in figures] == ["chart-bars-gdn", "chart-roofline", "chart-speedup-gdn"]
    text = json.dumps(figures, allow_nan=False)  # raises on NaN or infinity
    assert nasty not in text and "&lt;b&gt;x&lt;/b&gt;&#37;{y}" in text
    assert "inf_impl" not in text, "a job without a finite median is not drawn"


def test_ceiling_labels_name_their_units() -> None:
    assert charts.ceiling_labels(
        {"copy_gbps": 41.5, "matmul_tflops": 1.234, "other": 3.0, "matmul_dtype_bits": 16}
    ) == [
        "matmul 1.23 TFLOP/s",
        "copy 41.5 GB/s (read+write)",
        "matmul dtype 16 bit",
        "other 3",
    ]


def test_decode_jobs_get_their_own_panel(build) -> None:  # type: ignore[no-untyped-def]
    """Decode steps are a mode of their own: a bar panel titled decode, triangles on the roofline."""
    jobs = [_job(build, impl, mode, 4, median) for impl, median in MEDIANS.items() for mode in ("fwd", "decode")]
    doc = build.document(jobs=jobs).model_copy(update={"ceilings": CEILINGS})
    (fig,) = charts.op_bar_figures(doc)
    assert [a["text"] for a in fig["layout"]["annotations"]] == ["fwd", "decode"]
    assert _trace(fig, "triton_chunk", xaxis="x2")["y"] == [1.0]
    roof = charts.roofline_figure(doc)
    assert "triangle-up" in _trace(roof, "triton_chunk")["marker"]["symbol"]
