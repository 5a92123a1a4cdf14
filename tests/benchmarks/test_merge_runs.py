"""benchmarks/merge_runs.py: parts of one suite's run joined into one document, refused when they differ."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from deltabench.harness.documents_io import load_documents

ROOT = Path(__file__).parents[2]
SCRIPT = ROOT / "benchmarks" / "merge_runs.py"
REAL = ROOT / "benchmarks" / "results" / "fixtures" / "train-h200.json"  # a run the H200 made, cut into parts below


def _parts(tmp_path: Path) -> tuple[Path, Path, dict]:
    doc = json.loads(REAL.read_text())
    half = len(doc["jobs"]) // 2
    a = {**doc, "run_id": "a" * 32, "jobs": doc["jobs"][:half]}
    b = {**doc, "run_id": "b" * 32, "jobs": doc["jobs"][half:], "baselines": {}}
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    pa.write_text(json.dumps(a))
    pb.write_text(json.dumps(b))
    return pa, pb, doc


def _merge(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=120)


def test_parts_join_in_order_with_their_run_ids(tmp_path: Path) -> None:
    pa, pb, doc = _parts(tmp_path)
    out = tmp_path / "merged.json"
    run = _merge(pa, pb, "--out", out, "--gzip")
    assert run.returncode == 0, run.stderr
    (merged,) = load_documents(out)
    assert [j.job_id for j in merged.jobs] == [j["job_id"] for j in doc["jobs"]]
    assert merged.baselines == doc["baselines"]  # taken from the part that names one
    assert [m["run_id"] for m in merged.meta["merged_from"]] == ["a" * 32, "b" * 32]
    assert merged.run_id not in ("a" * 32, "b" * 32)
    assert (tmp_path / "merged.json.gz").stat().st_size > 0


def test_parts_from_different_commits_are_refused(tmp_path: Path) -> None:
    pa, pb, _ = _parts(tmp_path)
    other = json.loads(pb.read_text())
    other["environment"]["git_commit"] = "0" * 40
    pb.write_text(json.dumps(other))
    run = _merge(pa, pb, "--out", tmp_path / "merged.json")
    assert run.returncode == 2
    assert "differs in git_commit" in run.stderr and len(run.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "merged.json").exists()


def test_the_merged_table_prints_without_a_database(tmp_path: Path) -> None:
    pa, pb, doc = _parts(tmp_path)
    run = _merge(pa, pb, "--out", tmp_path / "merged.json", "--format", "markdown")
    assert run.returncode == 0, run.stderr
    rows = [line for line in run.stdout.splitlines() if line.startswith("| ") and " ms " not in line]
    jobs = {(j["impl"], j["case"]["mode"]) for j in doc["jobs"]}
    assert len(rows) >= len(jobs) > 1  # every impl and mode of both parts, one row each at least
    assert all(any(f"| {impl} |" in r for r in rows) for impl, _ in jobs)
