"""The dashboard's charts as Plotly figures (plain ``data`` and ``layout`` dicts, ready for JSON).

Pure functions of what the pages already load: a run's document (its rows as ``harness.report.result_rows``
computes them, and its ceilings) and a comparison. Each returns :class:`Figure` dicts, which a page embeds as JSON
and ``static/charts.js`` draws with the Plotly.js the app serves. Every number is finite (JSON has no NaN), every
axis names its unit.

- :func:`op_bar_figures`: per op, impls side by side per shape (median with IQR whiskers), a panel per mode;
- :func:`roofline_figure`: achieved TFLOP/s against arithmetic intensity under the machine's matmul and copy
  ceilings (GB/s in the hover text);
- :func:`speedup_figures`: per op, each impl's speedup over the op's baseline across shapes;
- :func:`ratio_figure`: a comparison's head/base ratios with their bootstrap intervals, coloured by outcome.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Sequence
from typing import Any

from deltabench.harness.document import ResultDocument
from deltabench.harness.report import result_rows

__all__ = [
    "MODES",
    "OUTCOME_COLORS",
    "Figure",
    "ceiling_labels",
    "op_bar_figures",
    "ratio_figure",
    "roofline_figure",
    "run_figures",
    "speedup_figures",
]

# {"id": DOM id, "title": str, "data": [trace, ...], "layout": {...}}, and "op" for the charts of one op.
Figure = dict[str, Any]

MODES = ("fwd", "fwd+bwd", "bwd", "decode")
# Plotly's default qualitative colours, so an impl keeps its colour in every chart of a page.
PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)
OUTCOME_COLORS = {
    "regression": "#c0392b",
    "correctness_failure": "#7b241c",
    "improvement": "#1e8449",
    "within_noise": "#7f8c8d",
    "not_comparable": "#b9770e",
}
# Units of the ceilings a runner measures (runners/ceilings.py); any other key is shown as it is.
CEILING_UNITS = {
    "matmul_tflops": ("matmul", "TFLOP/s"),
    "copy_gbps": ("copy", "GB/s (read+write)"),
    "matmul_dtype_bits": ("matmul dtype", "bit"),
}


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _fmt(x: float) -> str:
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.3g}"


def ceiling_labels(ceilings: dict[str, float]) -> list[str]:
    """The machine's ceilings as text with units: ``["matmul 1.2 TFLOP/s", "copy 40 GB/s (read+write)", ...]``."""
    known = [k for k in CEILING_UNITS if k in ceilings]
    out = []
    for key in known + sorted(k for k in ceilings if k not in CEILING_UNITS):
        value = ceilings[key]
        name, unit = CEILING_UNITS.get(key, (key, ""))
        shown = _fmt(value) if _finite(value) else "-"
        out.append(f"{name} {shown} {unit}".rstrip())
    return out


def _t(text: str) -> str:
    """`text` (an op, impl or shape from a stored document) safe inside a Plotly label or hover template.

    Plotly renders labels as a small HTML subset and reads ``%{...}`` as a template field; escaped, both show as
    typed (Plotly decodes the entities for display).
    """
    return html.escape(str(text), quote=False).replace("%", "&#37;")


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text).strip("-") or "x"


def _latest_rows(doc: ResultDocument) -> list[dict[str, Any]]:
    """``result_rows`` with a retried job's later attempt replacing the earlier one (as the run page's tables)."""
    rows: dict[tuple[str, ...], dict[str, Any]] = {}
    for row in result_rows(doc):
        rows[(row["op"], row["shape"], row["dtype"], row["mode"], row["impl"])] = row
    return list(rows.values())


def _timed(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r["status"] == "ok" and _finite(r["median_ms"]) and r["median_ms"] > 0]


def _colors(impls: Iterable[str]) -> dict[str, str]:
    return {impl: PALETTE[i % len(PALETTE)] for i, impl in enumerate(dict.fromkeys(impls))}


def _clock_label(rows: Sequence[dict[str, Any]]) -> str:
    clocks = sorted({r["clock"] for r in rows if r["clock"]})
    return f" ({', '.join(clocks)})" if clocks else ""


def _panel_axes(i: int, n: int, gap: float = 0.04) -> tuple[str, str, dict[str, Any], dict[str, Any]]:
    """Trace axis ids and layout axes of panel `i` of `n` side by side."""
    suffix = "" if i == 0 else str(i + 1)
    x0, x1 = i / n + (gap if i else 0), (i + 1) / n - (gap if i < n - 1 else 0)
    xaxis = {"domain": [x0, x1], "anchor": f"y{suffix}", "type": "category", "automargin": True}
    yaxis = {"anchor": f"x{suffix}", "rangemode": "tozero", "automargin": True}
    return f"x{suffix}", f"y{suffix}", xaxis, yaxis


def _panel_title(text: str, i: int, n: int) -> dict[str, Any]:
    return {
        "text": text,
        "x": (i + 0.5) / n,
        "y": 1.0,
        "xref": "paper",
        "yref": "paper",
        "xanchor": "center",
        "yanchor": "bottom",
        "showarrow": False,
        "font": {"size": 13},
    }


def op_bar_figures(doc: ResultDocument) -> list[Figure]:
    """Per op: a bar per impl for each shape and dtype, median with IQR whiskers, one panel per mode.

    Only ``ok`` jobs are drawn (the tables show the others with their reasons).
    """
    return _bars(_latest_rows(doc))


def _bars(latest: list[dict[str, Any]]) -> list[Figure]:
    rows = _timed(latest)
    colors = _colors(r["impl"] for r in rows)
    figures = []
    for op in dict.fromkeys(r["op"] for r in rows):
        mine = [r for r in rows if r["op"] == op]
        modes = [m for m in MODES if any(r["mode"] == m for r in mine)]
        impls = list(dict.fromkeys(r["impl"] for r in mine))
        unit = f"median ms{_clock_label(mine)}"
        data: list[dict[str, Any]] = []
        layout: dict[str, Any] = {
            "barmode": "group",
            "margin": {"t": 40, "r": 20, "b": 80, "l": 70},
            "legend": {"orientation": "h", "y": -0.25, "title": {"text": "impl"}},
            "annotations": [],
            "hovermode": "closest",
        }
        for i, mode in enumerate(modes):
            xid, yid, xaxis, yaxis = _panel_axes(i, len(modes))
            xaxis["title"] = {"text": "shape, dtype"}
            yaxis["title"] = {"text": unit}
            layout["xaxis" + xid[1:]] = xaxis
            layout["yaxis" + yid[1:]] = yaxis
            layout["annotations"].append(_panel_title(mode, i, len(modes)))
            cases = list(dict.fromkeys(f"{r['shape']} {r['dtype']}" for r in mine if r["mode"] == mode))
            for impl in impls:
                by_case = {f"{r['shape']} {r['dtype']}": r for r in mine if r["mode"] == mode and r["impl"] == impl}
                if not by_case:
                    continue
                xs = [c for c in cases if c in by_case]
                med = [by_case[c]["median_ms"] for c in xs]
                q1 = [by_case[c]["q1_ms"] if _finite(by_case[c]["q1_ms"]) else m for c, m in zip(xs, med, strict=True)]
                q3 = [by_case[c]["q3_ms"] if _finite(by_case[c]["q3_ms"]) else m for c, m in zip(xs, med, strict=True)]
                data.append(
                    {
                        "type": "bar",
                        "name": _t(impl),
                        "legendgroup": _t(impl),
                        "showlegend": not any(t["legendgroup"] == _t(impl) for t in data),
                        "x": xs,
                        "y": med,
                        "xaxis": xid,
                        "yaxis": yid,
                        "marker": {"color": colors[impl]},
                        "error_y": {
                            "type": "data",
                            "symmetric": False,
                            "array": [max(b - m, 0.0) for b, m in zip(q3, med, strict=True)],
                            "arrayminus": [max(m - a, 0.0) for a, m in zip(q1, med, strict=True)],
                            "thickness": 1.2,
                            "width": 3,
                        },
                        "customdata": [[a, b, by_case[c]["samples"]] for a, b, c in zip(q1, q3, xs, strict=True)],
                        "hovertemplate": f"{_t(impl)} · {mode}<br>%{{x}}<br>median %{{y:.4g}} ms"
                        "<br>IQR %{customdata[0]:.4g}-%{customdata[1]:.4g} ms · n=%{customdata[2]}<extra></extra>",
                    }
                )
        figures.append(
            {
                "id": f"chart-bars-{_slug(op)}",
                "op": op,
                "title": f"{op}: median time per shape (bars: median, whiskers: IQR)",
                "data": data,
                "layout": layout,
            }
        )
    return figures


def roofline_figure(doc: ResultDocument) -> Figure | None:
    """Achieved TFLOP/s against arithmetic intensity (FLOP/byte), log-log, under the machine's roofline.

    The roof is ``min(matmul ceiling, copy ceiling x intensity)`` from the run's ceilings; without them only the
    points are drawn. None when no ok job has work figures.
    """
    return _roofline(_latest_rows(doc), doc.ceilings)


def _roofline(latest: list[dict[str, Any]], ceilings: dict[str, float]) -> Figure | None:
    rows = [r for r in _timed(latest) if _finite(r["tflops"]) and _finite(r["gbps"]) and r["gbps"] > 0]
    rows = [r for r in rows if r["tflops"] > 0]
    if not rows:
        return None
    colors = _colors(r["impl"] for r in rows)
    data: list[dict[str, Any]] = []
    symbols = {"fwd": "circle", "fwd+bwd": "diamond", "bwd": "square", "decode": "triangle-up"}
    intensity = {id(r): 1e3 * r["tflops"] / r["gbps"] for r in rows}  # TFLOP/s over GB/s, in FLOP per byte
    for impl in colors:
        mine = [r for r in rows if r["impl"] == impl]
        data.append(
            {
                "type": "scatter",
                "mode": "markers",
                "name": _t(impl),
                "x": [intensity[id(r)] for r in mine],
                "y": [r["tflops"] for r in mine],
                "marker": {
                    "color": colors[impl],
                    "size": 9,
                    "symbol": [symbols.get(r["mode"], "circle") for r in mine],
                },
                "customdata": [
                    [
                        _t(f"{r['op']} {r['shape']} {r['dtype']} {r['mode']}"),
                        r["gbps"],
                        f"{r['pct_of_floor']:.3g}% of floor" if _finite(r["pct_of_floor"]) else "floor unknown",
                    ]
                    for r in mine
                ],
                "hovertemplate": f"{_t(impl)}<br>%{{customdata[0]}}<br>%{{y:.3g}} TFLOP/s · %{{customdata[1]:.3g}} GB/s"
                "<br>%{x:.3g} FLOP/byte · %{customdata[2]}<extra></extra>",
            }
        )
    xs = list(intensity.values())
    lo, hi = min(xs) / 4, max(xs) * 4
    peak, bandwidth = ceilings.get("matmul_tflops"), ceilings.get("copy_gbps")
    title = (
        "Roofline: achieved TFLOP/s vs arithmetic intensity "
        "(circles fwd, diamonds fwd+bwd, squares bwd, triangles decode)"
    )
    if _finite(peak) and _finite(bandwidth) and peak > 0 and bandwidth > 0:
        ridge = 1e3 * peak / bandwidth  # FLOP/byte where the copy roof meets the matmul roof
        lo, hi = min(lo, ridge / 4), max(hi, ridge * 4)
        data.append(
            {
                "type": "scatter",
                "mode": "lines",
                "name": f"copy ceiling {_fmt(bandwidth)} GB/s",
                "x": [lo, ridge],
                "y": [bandwidth * lo / 1e3, peak],
                "line": {"color": "#555", "dash": "dash"},
                "hoverinfo": "name",
            }
        )
        data.append(
            {
                "type": "scatter",
                "mode": "lines",
                "name": f"matmul ceiling {_fmt(peak)} TFLOP/s",
                "x": [ridge, hi],
                "y": [peak, peak],
                "line": {"color": "#222"},
                "hoverinfo": "name",
            }
        )
    else:
        title += " (ceilings not measured for this run)"
    layout = {
        "margin": {"t": 30, "r": 20, "b": 60, "l": 70},
        "xaxis": {"type": "log", "title": {"text": "arithmetic intensity (FLOP/byte)"}},
        "yaxis": {"type": "log", "title": {"text": "achieved TFLOP/s"}},
        "legend": {"orientation": "v"},
        "hovermode": "closest",
    }
    return {"id": "chart-roofline", "op": None, "title": title, "data": data, "layout": layout}


def speedup_figures(doc: ResultDocument) -> list[Figure]:
    """Per op with a baseline: each other impl's speedup over it (baseline median / impl median) across cases."""
    return _speedups(_latest_rows(doc), doc.baselines)


def log_ticks(low: float, high: float) -> list[float]:
    """Tick values of a log axis covering `low`..`high` (positive): every decade from the one at or below `low`
    to the one at or above `high` when the span passes a decade, else 1, 2 and 5 times each decade, so an axis
    never labels plotly's minor ticks (2, 3, ..., 6 times a decade) and always labels the decade above the data."""
    first, last = math.floor(math.log10(low)), math.ceil(math.log10(high))
    steps = (1.0,) if high / low > 10 else (1.0, 2.0, 5.0)
    ticks = [round(m * 10.0**e, 12) for e in range(first, last + 1) for m in steps]
    below, above = max(t for t in ticks if t <= low), min(t for t in ticks if t >= high)
    return [t for t in ticks if below <= t <= above]


def _speedups(latest: list[dict[str, Any]], baselines: dict[str, str]) -> list[Figure]:
    timed = _timed(latest)
    rows = [r for r in timed if _finite(r["speedup"])]
    colors = _colors(r["impl"] for r in timed)
    figures = []
    for op in dict.fromkeys(r["op"] for r in rows):
        baseline = baselines.get(op)
        mine = [r for r in rows if r["op"] == op and r["impl"] != baseline]
        if not baseline or not mine:
            continue
        cases = list(dict.fromkeys(f"{r['shape']} {r['dtype']} {r['mode']}" for r in rows if r["op"] == op))
        data = []
        for impl in dict.fromkeys(r["impl"] for r in mine):
            by_case = {f"{r['shape']} {r['dtype']} {r['mode']}": r["speedup"] for r in mine if r["impl"] == impl}
            xs = [c for c in cases if c in by_case]
            data.append(
                {
                    "type": "scatter",
                    "mode": "lines+markers",
                    "name": _t(impl),
                    "x": xs,
                    "y": [by_case[c] for c in xs],
                    "marker": {"color": colors.get(impl, PALETTE[0]), "size": 8},
                    "line": {"color": colors.get(impl, PALETTE[0])},
                    "hovertemplate": f"{_t(impl)}<br>%{{x}}<br>%{{y:.3g}}× vs {_t(baseline)}<extra></extra>",
                }
            )
        # The baseline as a trace, not a layout shape: shapes on a log axis take log coordinates.
        data.append(
            {
                "type": "scatter",
                "mode": "lines",
                "name": f"{_t(baseline)} (baseline, 1×)",
                "x": cases,
                "y": [1.0] * len(cases),
                "line": {"color": "#555", "dash": "dot"},
                "hoverinfo": "name",
            }
        )
        ticks = log_ticks(*(f([1.0, *(r["speedup"] for r in mine)]) for f in (min, max)))
        layout = {
            "margin": {"t": 30, "r": 20, "b": 90, "l": 70},
            "xaxis": {"type": "category", "title": {"text": "shape, dtype, mode"}, "automargin": True},
            "yaxis": {
                "type": "log",
                "title": {"text": f"speedup vs {_t(baseline)} (×, log scale)"},
                "tickvals": ticks,
                "ticktext": [f"{t:g}×" for t in ticks],
                # The axis spans the ticks, so the decade above the fastest impl is drawn and labelled.
                "range": [math.log10(ticks[0]) - 0.05, math.log10(ticks[-1]) + 0.05],
            },
            "legend": {"orientation": "h", "y": -0.35},
        }
        figures.append(
            {
                "id": f"chart-speedup-{_slug(op)}",
                "op": op,
                "title": f"{op}: speedup vs the baseline {baseline} (higher is faster)",
                "data": data,
                "layout": layout,
            }
        )
    return figures


def run_figures(doc: ResultDocument) -> list[Figure]:
    """Every chart of a run's page, in page order: bars per op, the roofline, speedups per op."""
    rows = _latest_rows(doc)  # once: it is most of the work
    roofline = _roofline(rows, doc.ceilings)
    return [*_bars(rows), *([roofline] if roofline else []), *_speedups(rows, doc.baselines)]


def ratio_figure(comparison: Any) -> Figure | None:
    """A comparison's ratios (head / base medians) with their intervals, one row per matched job.

    `comparison` has ``rows`` (op, impl, shape, dtype, mode, outcome, stats with ratio, ci_low, ci_high, level),
    ``threshold`` and ``alpha``, as ``schemas.ComparisonPublic``. Rows without statistics are left out. None when
    no row has any.
    """
    rows = [r for r in comparison.rows if r.stats is not None and _finite(r.stats.ratio) and r.stats.ratio > 0]
    if not rows:
        return None
    labels = [_t(f"{r.op} · {r.impl} · {r.shape} {r.dtype} {r.mode}") for r in rows]
    # Same label twice (e.g. two seeds of one case) would share a category row: number the repeats.
    seen: dict[str, int] = {}
    for i, label in enumerate(labels):
        seen[label] = seen.get(label, 0) + 1
        if seen[label] > 1:
            labels[i] = f"{label} #{seen[label]}"
    data = []
    level = rows[0].stats.level
    for outcome in dict.fromkeys(r.outcome for r in rows):
        idx = [i for i, r in enumerate(rows) if r.outcome == outcome]
        ratio = [rows[i].stats.ratio for i in idx]
        low = [rows[i].stats.ci_low if _finite(rows[i].stats.ci_low) else ratio[j] for j, i in enumerate(idx)]
        high = [rows[i].stats.ci_high if _finite(rows[i].stats.ci_high) else ratio[j] for j, i in enumerate(idx)]
        data.append(
            {
                "type": "scatter",
                "mode": "markers",
                "name": outcome.replace("_", " "),
                "x": ratio,
                "y": [labels[i] for i in idx],
                "marker": {"color": OUTCOME_COLORS.get(outcome, "#333"), "size": 9},
                "error_x": {
                    "type": "data",
                    "symmetric": False,
                    "array": [max(h - r, 0.0) for h, r in zip(high, ratio, strict=True)],
                    "arrayminus": [max(r - lo, 0.0) for lo, r in zip(low, ratio, strict=True)],
                    "thickness": 1.5,
                    "width": 4,
                },
                "customdata": [[lo, h] for lo, h in zip(low, high, strict=True)],
                "hovertemplate": "%{y}<br>ratio %{x:.4f}×"
                f"<br>{level * 100:g}% interval " + "[%{customdata[0]:.4f}, %{customdata[1]:.4f}]<extra></extra>",
            }
        )
    threshold = comparison.threshold

    def vline(x: float, dash: str) -> dict[str, Any]:
        return {
            "type": "line",
            "xref": "x",
            "x0": x,
            "x1": x,
            "yref": "paper",
            "y0": 0,
            "y1": 1,
            "line": {"color": "#555", "dash": dash, "width": 1},
        }

    layout = {
        "margin": {"t": 30, "r": 20, "b": 60, "l": 20},
        "height": max(260, 90 + 24 * len(rows)),
        "xaxis": {"title": {"text": "head / base median (ratio, ×; above 1 is slower)"}, "zeroline": False},
        "yaxis": {"type": "category", "categoryarray": labels, "autorange": "reversed", "automargin": True},
        "shapes": [vline(1.0, "solid"), vline(1.0 + threshold, "dot"), vline(max(1.0 - threshold, 1e-9), "dot")],
        "legend": {"orientation": "h", "y": 1.02, "yanchor": "bottom"},
        "hovermode": "closest",
    }
    return {
        "id": "chart-ratios",
        "op": None,
        "title": f"Ratio of medians with its {level * 100:g}% bootstrap interval"
        f" (dotted: ±{threshold * 100:g}% threshold)",
        "data": data,
        "layout": layout,
    }
