"""Result tables: speedups against the baseline, CPU labels, every format."""

from __future__ import annotations

import csv
import io
import json

import pytest

from deltabench.harness.document import (
    CaseSpec,
    CheckRecord,
    Environment,
    JobResult,
    MemoryStats,
    ResultDocument,
    WorkFigures,
)
from deltabench.harness.errors import BadInput
from deltabench.harness.report import print_results, render_results, result_rows
from deltabench.runners.timing import summarize


def _job(impl: str, status: str, samples=None, reason="", clock="cpu_monotonic", op="gdn") -> JobResult:
    case = CaseSpec(op=op, B=1, T=64, H=2, K=16, V=16, dtype="fp32", mode="fwd")
    check = CheckRecord(check="output", metric="rel_fro", value=0.5, threshold=1e-5, passed=status != "incorrect")
    return JobResult(
        case=case,
        impl=impl,
        status=status,
        reason=reason,
        gate_reference="float64 oracle",
        verification=[check] if status in ("ok", "incorrect") else [],
        timing=summarize(samples, clock=clock) if samples else None,
        memory=MemoryStats(peak_bytes=3 * 2**20, method="host RSS high-water growth") if samples else None,
        work=WorkFigures(flops=2e9, bytes=1e6, tflops=1.0, pct_of_floor=12.5) if samples else None,
    )


@pytest.fixture
def doc() -> ResultDocument:
    env = Environment(
        host="box", machine_kind="cpu", device_name="Test CPU", torch="2.13", git_commit="abc123def456789"
    )
    return ResultDocument(
        suite="unit",
        baselines={"gdn": "base"},
        environment=env,
        ceilings={"matmul_tflops": 1.5, "copy_gbps": 20.0},
        jobs=[
            _job("base", "ok", [4.0, 4.0, 4.0]),
            _job("fast", "ok", [1.0, 2.0, 3.0]),
            _job("wrong", "incorrect", reason="failed the gate: output rel_fro 5.00e-01 > 1.0e-05"),
            _job("gpu_only", "unsupported", reason="runs on cuda, not cpu"),
        ],
    )


def test_rows_carry_speedup_against_the_baseline(doc):
    rows = {r["impl"]: r for r in result_rows(doc)}
    assert rows["base"]["speedup"] == 1.0
    assert rows["fast"]["speedup"] == pytest.approx(2.0)  # baseline 4 ms / median 2 ms
    assert rows["fast"]["iqr_ms"] == pytest.approx(1.0)
    assert rows["wrong"]["median_ms"] is None and rows["wrong"]["speedup"] is None
    assert rows["fast"]["clock"] == "CPU" and rows["fast"]["peak_mib"] == 3.0


def test_markdown_has_environment_block_and_a_table_per_op(doc):
    md = render_results(doc, "markdown")
    assert md.startswith("## deltabench results: `unit`")
    assert "machine: cpu (Test CPU x1)" in md and "commit abc123def456" in md
    assert "ceilings: matmul 1.5 TFLOP/s" in md and "CPU times are host timings" in md
    assert "### gdn: Gated DeltaNet (baseline: base)" in md
    assert "| shape | dtype | mode | impl | median ms (CPU) |" in md
    fast = next(line for line in md.splitlines() if "| fast |" in line)
    assert "| 2 |" in fast and "2.00x" in fast and "| ok |" in fast
    assert "unsupported: runs on cuda, not cpu" in md
    assert "incorrect: failed the gate" in md


def test_a_cut_or_merged_run_says_so_and_a_whole_one_does_not(doc):
    assert "incomplete" not in render_results(doc, "markdown")  # no "complete" key: a document from before it
    whole = doc.model_copy(update={"meta": {"complete": True}})
    assert "incomplete" not in render_results(whole, "markdown") and "merged from" not in render_results(whole)
    parts = [{"run_id": "a" * 32, "created_at": "2026-12-02T07:16:00"}, {"run_id": "b" * 32, "created_at": "x"}]
    cut = doc.model_copy(update={"meta": {"complete": False, "merged_from": parts}})
    md = render_results(cut, "markdown")
    assert "- incomplete: the run was cut before its end" in md
    assert f"- merged from 2 runs: `{'a' * 12}`, `{'b' * 12}`" in md


def test_csv_and_json_are_machine_readable(doc):
    rows = list(csv.DictReader(io.StringIO(render_results(doc, "csv"))))
    assert [r["impl"] for r in rows] == ["base", "fast", "wrong", "gpu_only"]
    assert float(rows[1]["speedup"]) == pytest.approx(2.0) and rows[2]["median_ms"] == ""
    payload = json.loads(render_results(doc, "json"))
    assert payload["run_id"] == doc.run_id and payload["baselines"] == {"gdn": "base"}
    assert payload["rows"][1]["median_ms"] == 2.0


def test_table_and_rich_output_label_cpu_timings(doc):
    text = render_results(doc, "table")
    assert "median ms (CPU)" in text and "2.00x" in text and "runs on cuda, not cpu" in text
    from rich.console import Console

    console = Console(file=io.StringIO(), width=200)
    print_results(doc, console)
    assert "median ms (CPU)" in console.file.getvalue()


def test_mixed_clocks_get_a_clock_column(doc):
    doc.jobs.append(_job("jaxy", "ok", [1.0, 1.0, 1.0], clock="jax"))
    md = render_results(doc, "markdown")
    assert "| median ms | IQR ms | clock |" in md and "| JAX |" in md


def test_unknown_format_is_bad_input(doc):
    with pytest.raises(BadInput, match="unknown format 'xml'"):
        render_results(doc, "xml")
