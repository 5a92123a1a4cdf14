"""Result tables: per op, impl x shape with median and IQR, speedup vs the baseline, TFLOP/s, % of the
roofline floor, peak memory and status with its reason.

:func:`render_results` gives ``table`` (plain text), ``csv``, ``json`` or ``markdown`` (what gets
committed under benchmarks/, with an environment header block); :func:`print_results` prints the rich
tables. CPU timings are labelled as such wherever they show. Plain Python only: workers need no pandas.
"""

from __future__ import annotations

import csv
import io
import json
from typing import Any

from .document import MIXER_SHARE, JobResult, ResultDocument

__all__ = ["CLOCK_LABELS", "FORMATS", "print_results", "render_results", "result_rows"]

FORMATS = ("table", "csv", "json", "markdown")
CLOCK_LABELS = {
    "cpu_monotonic": "CPU",
    "cuda_events": "CUDA events",
    "cuda_graph": "CUDA graph",
    "jax": "JAX",
}
_COLUMNS = (
    "op",
    "shape",
    "dtype",
    "mode",
    "impl",
    "status",
    "reason",
    "clock",
    "median_ms",
    "q1_ms",
    "q3_ms",
    "iqr_ms",
    "samples",
    "compile_s",
    "speedup",
    "tflops",
    "gbps",
    "floor_ms",
    "pct_of_floor",
    "peak_mib",
    "memory_method",
    "gate_reference",
    "tokens_per_s",
    "mixer_pct",
)


def _group_key(job: JobResult) -> tuple[str, str, str, str, str, int, bool]:
    c = job.case
    return (c.op, c.shape_id, c.dtype, c.mode, c.regime, c.seed, c.initial_state)


def result_rows(doc: ResultDocument) -> list[dict[str, Any]]:
    """One flat row per job, in the document's order, with the speedup against the op's baseline."""
    base_ms: dict[tuple, float] = {}
    for job in doc.jobs:
        if job.status == "ok" and job.timing and doc.baselines.get(job.case.op) == job.impl:
            base_ms[_group_key(job)] = job.timing.median_ms
    rows = []
    for job in doc.jobs:
        t, m, w = job.timing, job.memory, job.work
        base = base_ms.get(_group_key(job))
        rows.append(
            {
                "op": job.case.op,
                "shape": job.case.shape_id,
                "dtype": job.case.dtype,
                "mode": job.case.mode,
                "impl": job.impl,
                "status": job.status,
                "reason": job.reason,
                "clock": CLOCK_LABELS.get(t.clock, t.clock) if t else "",
                "median_ms": t.median_ms if t else None,
                "q1_ms": t.q1_ms if t else None,
                "q3_ms": t.q3_ms if t else None,
                "iqr_ms": t.iqr_ms if t else None,
                "samples": len(t.samples_ms) if t else 0,
                "compile_s": t.compile_s if t else None,
                "speedup": base / t.median_ms if t and base and t.median_ms > 0 else None,
                "tflops": w.tflops if w else None,
                "gbps": w.gbps if w else None,
                "floor_ms": w.floor_ms if w else None,
                "pct_of_floor": w.pct_of_floor if w else None,
                "peak_mib": m.peak_bytes / 2**20 if m else None,
                "memory_method": m.method if m else "",
                "gate_reference": job.gate_reference if job.verification else "",
                "tokens_per_s": job.case.B * job.case.T / (t.median_ms / 1e3) if t and t.median_ms > 0 else None,
                "mixer_pct": next((r.value for r in job.verification if r.check == MIXER_SHARE), None),
            }
        )
    return rows


def _num(x: float | None, digits: int = 3) -> str:
    if x is None:
        return "-"
    if x == 0:
        return "0"
    if abs(x) >= 100:
        return f"{x:.0f}"
    return f"{x:.{digits}g}"


def _status(row: dict[str, Any], width: int) -> str:
    if row["status"] == "ok" or not row["reason"]:
        return row["status"]
    text = f"{row['status']}: {' '.join(str(row['reason']).split())}"
    return text if len(text) <= width else text[: width - 3] + "..."


def _op_tables(doc: ResultDocument, reason_width: int) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, header, cells) per op, in the order ops first appear."""
    from .ops import OPS

    rows = result_rows(doc)
    out = []
    for op in dict.fromkeys(r["op"] for r in rows):
        mine = [r for r in rows if r["op"] == op]
        clocks = {r["clock"] for r in mine if r["clock"]}
        one_clock = len(clocks) == 1
        methods = {r["memory_method"] for r in mine if r["memory_method"]}
        mem_label = " (host RSS)" if methods and all("RSS" in m for m in methods) else ""
        time_label = f" ({next(iter(clocks))})" if one_clock else ""
        header = ["shape", "dtype", "mode", "impl", f"median ms{time_label}", "IQR ms"]
        if not one_clock:
            header.append("clock")
        spec = OPS.get(op)
        training = spec is not None and spec.training is not None  # a model's step: its tokens/s and mixer share
        header += ["vs baseline", "TFLOP/s", "% of floor", f"peak MiB{mem_label}"]
        header += ["tokens/s", "mixer % of step", "status"] if training else ["status"]
        cells = []
        for r in mine:
            row = [r["shape"], r["dtype"], r["mode"], r["impl"], _num(r["median_ms"]), _num(r["iqr_ms"], 2)]
            if not one_clock:
                row.append(r["clock"] or "-")
            speed = "-" if r["speedup"] is None else f"{r['speedup']:.2f}x"
            row += [speed, _num(r["tflops"]), _num(r["pct_of_floor"], 2), _num(r["peak_mib"])]
            if training:
                row += [_num(r["tokens_per_s"]), _num(r["mixer_pct"], 2)]
            row.append(_status(r, reason_width))
            cells.append(row)
        title = f"{op}: {spec.title if spec else op} (baseline: {doc.baselines.get(op, '-')})"
        out.append((title, header, cells))
    return out


def _environment_lines(doc: ResultDocument) -> list[str]:
    e = doc.environment
    sw = [f"torch {e.torch}" if e.torch else "", f"triton {e.triton}" if e.triton else ""]
    sw += [
        f"jax {e.jax}" if e.jax else "",
        f"CUDA {e.cuda}" if e.cuda else "",
        f"driver {e.driver}" if e.driver else "",
    ]
    commit = (e.git_commit or "unknown")[:12] + (" (dirty)" if e.git_dirty else "")
    ceil = doc.ceilings
    lines = [
        f"run `{doc.run_id}`, {doc.created_at:%Y-%m-%d %H:%M} UTC, suite `{doc.suite}`",
        f"machine: {e.machine_kind} ({e.device_name} x{e.device_count}), host {e.host}, {e.platform}",
        f"software: Python {e.python}, " + ", ".join(s for s in sw if s),
        f"deltabench {e.deltabench}, commit {commit}, kernel hash {e.kernel_hash or '-'}",
    ]
    caches = {k.removeprefix("cache."): v for k, v in e.extra.items() if k.startswith("cache.")}
    if caches:  # where compiled kernels and references persist: "absent" or "empty" was a cold start
        lines.append("caches at the start: " + "; ".join(f"{k} {v}" for k, v in caches.items()))
    if ceil:
        lines.append(
            f"ceilings: matmul {_num(ceil.get('matmul_tflops'))} TFLOP/s, copy {_num(ceil.get('copy_gbps'))} GB/s"
            " (read+write); % of floor = 100 * max(FLOP/peak, bytes/bandwidth) / median"
        )
    clocks = sorted({CLOCK_LABELS.get(j.timing.clock, j.timing.clock) for j in doc.jobs if j.timing})
    if clocks:
        lines.append("clocks: " + ", ".join(clocks) + ("; CPU times are host timings" if "CPU" in clocks else ""))
    refs = sorted({j.gate_reference for j in doc.jobs if j.verification})
    if refs:
        lines.append("gate reference: " + "; ".join(refs))
    parts = doc.meta.get("merged_from") or []
    if parts:
        lines.append(f"merged from {len(parts)} runs: " + ", ".join(f"`{p['run_id'][:12]}`" for p in parts))
    if doc.meta.get("complete") is False:  # a run cut short keeps only the jobs that ended
        lines.append("incomplete: the run was cut before its end; the suite's jobs not shown here did not run")
    return lines


def _markdown(doc: ResultDocument) -> str:
    out = [f"## deltabench results: `{doc.suite}`", ""]
    out += [f"- {line}" for line in _environment_lines(doc)]
    for title, header, cells in _op_tables(doc, reason_width=160):
        out += ["", f"### {title}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for row in cells:
            out.append("| " + " | ".join(c.replace("|", "\\|") for c in row) + " |")
    return "\n".join(out) + "\n"


def _csv(doc: ResultDocument) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in result_rows(doc):
        writer.writerow({k: "" if v is None else v for k, v in row.items()})
    return buf.getvalue()


def _json(doc: ResultDocument) -> str:
    payload = {
        "run_id": doc.run_id,
        "suite": doc.suite,
        "created_at": doc.created_at.isoformat(),
        "environment": doc.environment.model_dump(),
        "ceilings": doc.ceilings,
        "baselines": doc.baselines,
        "rows": result_rows(doc),
    }
    return json.dumps(payload, indent=1)


def _rich_tables(doc: ResultDocument) -> list[Any]:
    from rich.table import Table

    tables = []
    for title, header, cells in _op_tables(doc, reason_width=90):
        table = Table(title=title, title_justify="left")
        for i, col in enumerate(header):
            numeric = col.startswith(("median", "IQR", "vs", "TFLOP", "%", "peak"))
            table.add_column(col, justify="right" if numeric else "left", overflow="fold", no_wrap=i < 4)
        for row in cells:
            status = row[-1]
            color = "green" if status == "ok" else "yellow" if status.startswith("unsupported") else "red"
            table.add_row(*row[:-1], f"[{color}]{_escape(status)}[/]")
        tables.append(table)
    return tables


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def print_results(doc: ResultDocument, console: Any) -> None:
    """Print the environment line and a rich table per op to `console` (a ``rich.console.Console``)."""
    for line in _environment_lines(doc)[:2]:
        console.print(_escape(line), highlight=False)
    for table in _rich_tables(doc):
        console.print(table)


def render_results(doc: ResultDocument, fmt: str = "table") -> str:
    """The run's results as text: ``table``, ``csv``, ``json`` or ``markdown``."""
    if fmt == "markdown":
        return _markdown(doc)
    if fmt == "csv":
        return _csv(doc)
    if fmt == "json":
        return _json(doc)
    if fmt == "table":
        from rich.console import Console

        console = Console(file=io.StringIO(), width=200, color_system=None, force_terminal=False)
        for line in _environment_lines(doc):
            console.print(_escape(line), highlight=False)
        for table in _rich_tables(doc):
            console.print(table)
        return console.file.getvalue()
    from .errors import BadInput

    raise BadInput(f"unknown format {fmt!r}: use one of {', '.join(FORMATS)}")
