"""pytest-benchmark JSON files: converted to result documents, ingested, and gated on like deltabench runs."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import numpy as np
import pytest

from deltabench.cli.app import main
from deltabench.harness.document import ResultDocument
from deltabench.harness.errors import BadInput
from deltabench.harness.pytest_benchmark import EXTERNAL_OP, is_pytest_benchmark, machine_kind_of, to_document

_MACHINE = {
    "node": "ci-runner-7",
    "processor": "x86_64",
    "machine": "x86_64",
    "python_compiler": "GCC 12.2.0",
    "python_implementation": "CPython",
    "python_implementation_version": "3.11.9",
    "python_version": "3.11.9",
    "python_build": ["main", "Apr  2 2024 08:25:04"],
    "release": "6.1.0-18-amd64",
    "system": "Linux",
    "cpu": {"brand_raw": "AMD EPYC 7R13 Processor", "arch": "X86_64", "bits": 64, "count": 2},
}


def pytest_benchmark_file(
    scale: float = 1.0, *, seed: int = 0, with_data: bool = True, commit: str = "a" * 40, rounds: int = 60
) -> dict:
    """A realistic pytest-benchmark JSON (as ``--benchmark-json --benchmark-save-data`` writes it), two benchmarks."""
    rng = np.random.default_rng(seed)
    benches = []
    for name, base_s, params in (
        ("test_chunk_fwd[T1024]", 2.0e-3, {"T": 1024}),
        ("test_chunk_fwd[T4096]", 7.5e-3, {"T": 4096}),
    ):
        data = base_s * scale * np.exp(rng.normal(0.0, 0.01, rounds))
        out = rng.random(rounds) < 0.02
        data[out] *= 1.3
        d = sorted(data.tolist())
        q1, q3 = np.quantile(d, [0.25, 0.75])
        stats = {
            "min": d[0],
            "max": d[-1],
            "mean": statistics.fmean(d),
            "stddev": statistics.stdev(d),
            "rounds": rounds,
            "median": statistics.median(d),
            "iqr": float(q3 - q1),
            "q1": float(q1),
            "q3": float(q3),
            "iqr_outliers": int(out.sum()),
            "stddev_outliers": 3,
            "outliers": f"3;{int(out.sum())}",
            "ld15iqr": d[0],
            "hd15iqr": d[-1],
            "ops": 1.0 / statistics.fmean(d),
            "total": float(sum(d)),
            "iterations": 1,
        }
        if with_data:
            stats["data"] = data.tolist()
        benches.append(
            {
                "group": "gdn",
                "name": name,
                "fullname": f"benchmarks/test_gdn.py::{name}",
                "params": params,
                "param": str(params["T"]),
                "extra_info": {"tokens": params["T"]},
                "options": {
                    "disable_gc": False,
                    "timer": "perf_counter",
                    "min_rounds": 5,
                    "max_time": 1.0,
                    "min_time": 5e-06,
                    "warmup": False,
                },
                "stats": stats,
            }
        )
    return {
        "machine_info": _MACHINE,
        "commit_info": {
            "id": commit,
            "time": "2026-11-28T10:00:00+00:00",
            "author_time": "2026-11-28T10:00:00+00:00",
            "dirty": False,
            "project": "kernels",
            "branch": "main",
        },
        "benchmarks": benches,
        "datetime": "2026-11-28T10:05:00.123456+00:00",
        "version": "5.1.0",
    }


def test_conversion_keeps_names_samples_and_environment() -> None:
    obj = pytest_benchmark_file()
    assert is_pytest_benchmark(obj)
    doc = to_document(obj)
    assert len(doc.jobs) == 2
    job = doc.jobs[0]
    assert job.case.op == EXTERNAL_OP
    assert job.impl == "benchmarks/test_gdn.py::test_chunk_fwd[T1024]"
    assert job.status == "ok"
    assert len(job.timing.samples_ms) == 60
    assert job.timing.median_ms == pytest.approx(obj["benchmarks"][0]["stats"]["median"] * 1e3)
    assert json.loads(job.notes)["params"] == {"T": 1024}
    env = doc.environment
    assert env.machine_kind == "cpu-amd-epyc-7r13-processor" == machine_kind_of(_MACHINE)
    assert env.git_commit == "a" * 40 and env.python == "3.11.9" and env.host == "ci-runner-7"
    assert doc.created_at.year == 2026
    # The document survives its own JSON round trip (what ingest and the gate's file path read).
    assert ResultDocument.from_json(doc.to_json()) == doc


def test_ids_derive_from_content() -> None:
    a, b = to_document(pytest_benchmark_file()), to_document(pytest_benchmark_file())
    assert a.run_id == b.run_id and [j.job_id for j in a.jobs] == [j.job_id for j in b.jobs]
    assert to_document(pytest_benchmark_file(seed=1)).run_id != a.run_id


def test_detection_and_rejection() -> None:
    assert not is_pytest_benchmark({"jobs": [], "environment": {}})
    assert not is_pytest_benchmark([])
    with pytest.raises(BadInput):
        to_document({"benchmarks": [], "jobs": []})
    without_median = pytest_benchmark_file()
    del without_median["benchmarks"][0]["stats"]["median"]
    with pytest.raises(BadInput):
        to_document(without_median)


def test_without_raw_data_the_summary_is_kept() -> None:
    doc = to_document(pytest_benchmark_file(with_data=False))
    t = doc.jobs[0].timing
    assert t.samples_ms == [] and t.sem_rel > 0 and t.q1_ms < t.median_ms < t.q3_ms


def _write(tmp_path: Path, name: str, obj: dict) -> str:
    p = tmp_path / name
    p.write_text(json.dumps(obj))
    return str(p)


def _gate(*args: str) -> int:
    with pytest.raises(SystemExit) as exc:
        main(["gate", *args])
    return int(exc.value.code)


@pytest.mark.parametrize("with_data", [True, False], ids=["raw-data", "summary-only"])
def test_gate_on_pytest_benchmark_files(tmp_path: Path, with_data: bool) -> None:
    base = _write(tmp_path, "base.json", pytest_benchmark_file(seed=1, with_data=with_data))
    same = _write(tmp_path, "same.json", pytest_benchmark_file(seed=2, with_data=with_data))
    slow = _write(tmp_path, "slow.json", pytest_benchmark_file(1.10, seed=3, with_data=with_data))
    md = tmp_path / "comment.md"
    # Files carry no run-to-run evidence (no repetitions, no history): the gate cannot call them the same.
    assert _gate("--base", base, "--head", same) == 3
    # A head 10% slower is not a PASS either: without evidence it is unknown (exit 3), never exit 0.
    assert _gate("--base", base, "--head", slow) == 3
    # pytest-benchmark machines are CPUs: without history, the spread of a quiet dedicated runner is given.
    assert _gate("--base", base, "--head", slow, "--markdown", str(md), "--default-spread", "2%") == 1
    assert _gate("--base", base, "--head", slow, "--default-spread", "nope") == 2
    text = md.read_text()
    assert "Regressions (2)" in text and "test_chunk_fwd[T4096]" in text
    assert text.rstrip().splitlines()[-1].startswith("**FAIL**: 0 same, 2 different")
    assert ", 2 regressions," in text.rstrip().splitlines()[-1]


def test_ingest_accepts_pytest_benchmark_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from deltabench.db.engine import dispose_engines, get_engine, session_scope
    from deltabench.db.queries import load_run_document

    path = _write(tmp_path, "bench.json", pytest_benchmark_file())
    db = str(tmp_path / "store.sqlite")
    for _ in range(2):  # twice: stored once
        with pytest.raises(SystemExit) as exc:
            main(["ingest", path, "--db", db])
        assert exc.value.code == 0
    run_ids = set(capsys.readouterr().out.split())
    assert run_ids == {to_document(pytest_benchmark_file()).run_id}
    with session_scope(get_engine(db)) as session:
        doc = load_run_document(session, run_ids.pop())
    assert sorted(j.impl for j in doc.jobs) == sorted(b["fullname"] for b in pytest_benchmark_file()["benchmarks"])
    assert len(doc.jobs[0].timing.samples_ms) == 60
    dispose_engines()
