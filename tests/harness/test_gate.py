"""``deltabench gate`` and ``compare``: exit codes, markdown, and runs named by file, run id or git ref."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from deltabench.cli.app import main
from deltabench.cli.gate import load_run, parse_threshold
from deltabench.harness.document import CaseSpec, CheckRecord, Environment, JobResult, ResultDocument, WorkFigures
from deltabench.harness.errors import BadInput
from deltabench.regression import compare_documents
from deltabench.regression.render import render_markdown
from deltabench.runners.timing import summarize

_SHAPES = ((1, 1024, 6, 128), (8, 4096, 6, 128), (4, 8192, 16, 128))


def _samples(rng: np.random.Generator, median_ms: float, n: int = 60) -> list[float]:
    """CUDA-event-like timings: 1% lognormal noise, 2% outliers up to +40%."""
    x = median_ms * np.exp(rng.normal(0.0, 0.01, n))
    out = rng.random(n) < 0.02
    x[out] *= 1.0 + rng.uniform(0.05, 0.4, out.sum())
    return x.tolist()


def run_document(
    *,
    seed: int,
    slow: dict[str, float] | None = None,
    status: dict[str, str] | None = None,
    commit: str = "b" * 40,
    machine_kind: str = "h200",
) -> ResultDocument:
    """A realistic H200 run: two gdn impls at three shapes, fwd and fwd+bwd, gated and timed."""
    rng = np.random.default_rng(seed)
    slow, status = slow or {}, status or {}
    jobs = []
    for impl, speed in (("triton_chunk", 1.0), ("fla_chunk", 0.8)):
        for B, T, H, D in _SHAPES:
            for mode, factor in (("fwd", 1.0), ("fwd+bwd", 3.0)):
                case = CaseSpec(op="gdn", B=B, T=T, H=H, K=D, V=D, dtype="bf16", mode=mode)
                st = status.get(impl, "ok")
                median = 0.4 * speed * factor * B * T / 8192 * slow.get(impl, 1.0)
                timing = summarize(_samples(rng, median), clock="cuda_events", l2_flush=True) if st == "ok" else None
                check = CheckRecord(check="output", metric="rel_fro", value=4e-3, threshold=1e-2, passed=st == "ok")
                jobs.append(
                    JobResult(
                        case=case,
                        impl=impl,
                        backend="triton",
                        device="cuda",
                        status=st,
                        reason="" if st == "ok" else "output rel_fro 0.31 > 0.01",
                        verification=[check],
                        timing=timing,
                        work=WorkFigures(flops=1e9, bytes=1e8),
                    )
                )
    env = Environment(
        host="gpu-01",
        machine_kind=machine_kind,
        device_name="NVIDIA H200",
        torch="2.11.0+cu130",
        triton="3.6.0",
        cuda="13.0",
        git_commit=commit,
    )
    return ResultDocument(suite="gdn-h200", environment=env, jobs=jobs, baselines={"gdn": "fla_chunk"})


def _write(tmp_path: Path, name: str, doc: ResultDocument) -> str:
    path = tmp_path / name
    path.write_text(doc.to_json())
    return str(path)


def _cli(*args: str) -> int:
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    return int(exc.value.code)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    tmp = tmp_path_factory.mktemp("runs")
    return {
        "base": _write(tmp, "base.json", run_document(seed=1)),
        "same": _write(tmp, "same.json", run_document(seed=2)),
        "slow": _write(tmp, "slow.json", run_document(seed=3, slow={"triton_chunk": 1.10})),
        "fast": _write(tmp, "fast.json", run_document(seed=4, slow={"triton_chunk": 0.85})),
        "broken": _write(tmp, "broken.json", run_document(seed=5, status={"triton_chunk": "incorrect"})),
        "a100": _write(tmp, "a100.json", run_document(seed=6, slow={"triton_chunk": 1.5}, machine_kind="a100")),
    }


def test_exit_codes(files: dict[str, str], tmp_path: Path) -> None:
    # One run a side, no history: the spread is the machine class's assumed default, so no job can be SAME.
    assert _cli("gate", "--base", files["base"], "--head", files["same"]) == 3
    assert _cli("gate", "--base", files["base"], "--head", files["same"], "--unknown", "pass") == 0
    assert _cli("gate", "--base", files["base"], "--head", files["same"], "--unknown", "fail") == 1
    # A spread measured on this machine, small enough to see a 5% change: SAME.
    assert _cli("gate", "--base", files["base"], "--head", files["same"], "--default-spread", "1%") == 0
    assert _cli("gate", "--base", files["base"], "--head", files["slow"]) == 1
    assert _cli("gate", "--base", files["base"], "--head", files["slow"], "--unknown", "pass") == 1
    assert _cli("gate", "--base", files["base"], "--head", files["fast"]) == 3  # the other impl's jobs: unknown
    assert _cli("gate", "--base", files["base"], "--head", files["fast"], "--default-spread", "1%") == 0
    assert _cli("gate", "--base", files["base"], "--head", files["broken"]) == 1
    assert _cli("gate", "--base", files["base"], "--head", files["a100"]) == 3  # nothing comparable: unknown
    assert _cli("gate", "--base", files["base"], "--head", files["same"], "--unknown", "maybe") == 2
    assert _cli("compare", files["base"], files["slow"]) == 0
    assert _cli("compare", files["base"], files["broken"]) == 0
    # Bad input: exit 2.
    assert _cli("gate", "--base", files["base"], "--head", str(tmp_path / "missing.json")) == 2
    assert _cli("gate", "--base", files["base"], "--head", files["same"], "--threshold", "5") == 2
    assert _cli("gate", "--base", files["base"], "--head", files["same"], "--alpha", "2") == 2
    not_json = tmp_path / "notes.json"
    not_json.write_text("regressions: none")
    assert _cli("gate", "--base", files["base"], "--head", str(not_json)) == 2
    assert _cli("compare", files["base"]) == 2


def test_a_stricter_threshold_still_needs_significance(files: dict[str, str]) -> None:
    measured = ("--default-spread", "1%")
    assert _cli("gate", "--base", files["base"], "--head", files["same"], "--threshold", "0%", *measured) == 3
    assert _cli("gate", "--base", files["base"], "--head", files["slow"], "--threshold", "15%", *measured) == 0


def test_markdown_comment(files: dict[str, str], tmp_path: Path) -> None:
    md = tmp_path / "comment.md"
    js = tmp_path / "cmp.json"
    assert _cli("gate", "--base", files["base"], "--head", files["slow"], "--markdown", str(md), "--json", str(js)) == 1
    text = md.read_text()
    lines = text.rstrip().splitlines()
    assert lines[0] == "### deltabench performance gate"
    assert "#### Regressions (6)" in text and "#### Improvements" not in text
    assert "| 99% CI |" in text
    assert "| min detectable |" in text
    rows = [ln for ln in lines if ln.startswith("| DIFFERENT | gdn | `triton_chunk`")]
    assert len(rows) >= 6 and all("1.1" in ln and "[1.0" in ln for ln in rows[:6])
    # One run a side: the other impl's jobs are within noise but UNKNOWN, each with its smallest detectable change.
    assert "#### Unknown (6): cannot tell a 5% change from noise" in text
    assert "To resolve: run with --repeat auto --base-ref bbbbbbbbbb" in text
    unknown = [ln for ln in lines if ln.startswith("| UNKNOWN | gdn | `fla_chunk`")]
    assert len(unknown) == 6 and all("\u00b13.3%" in ln for ln in unknown)
    assert lines[-1].startswith("**FAIL**: 0 same, 6 different, 6 unknown, 6 regressions, 0 correctness failures")
    assert "`bbbbbbbbbb`" in lines[-1] and "to resolve: run with --repeat auto --base-ref" in lines[-1]
    out = json.loads(js.read_text())
    assert out["failed"] is True and out["verdict"] == "different"
    assert out["verdicts"] == {"same": 0, "different": 6, "unknown": 6}
    mdcs = [r["stats"]["min_detectable_change"] for r in out["rows"] if r["verdict"] == "unknown"]
    assert len(mdcs) == 6 and all(m == pytest.approx(0.033, abs=0.001) for m in mdcs)


def test_markdown_for_correctness_failures_and_improvements(files: dict[str, str]) -> None:
    base = load_run(files["base"])
    broken = render_markdown(compare_documents(base, load_run(files["broken"])))
    assert "#### Correctness failures (6)" in broken and "head incorrect: output rel_fro 0.31 > 0.01" in broken
    summary = broken.rstrip().splitlines()[-1]
    assert summary.startswith("**FAIL**: 0 same, 6 different, 6 unknown, 0 regressions, 6 correctness failures")
    fast = render_markdown(compare_documents(base, load_run(files["fast"])))
    assert "#### Improvements (6)" in fast and "0.85" in fast
    assert fast.rstrip().splitlines()[-1].startswith("**UNKNOWN**: 0 same, 6 different, 6 unknown")
    other = render_markdown(compare_documents(base, load_run(files["a100"])))
    assert "machine_kind h200 vs a100" in other and "12 not comparable" in other


def test_parse_threshold() -> None:
    assert parse_threshold("5%") == pytest.approx(0.05)
    assert parse_threshold("0.1") == pytest.approx(0.1)
    for bad in ("5", "abc", "-3%"):
        with pytest.raises(BadInput):
            parse_threshold(bad)


def _git(repo: Path, *args: str) -> str:
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
        "PATH": "/usr/bin:/bin",
        "HOME": str(repo),
    }
    return subprocess.run(["git", *args], cwd=repo, env=env, capture_output=True, text=True, check=True).stdout.strip()


def test_runs_from_the_database_by_run_id_and_git_ref(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from deltabench.db.engine import dispose_engines, get_engine, session_scope
    from deltabench.db.ingest import ingest_document

    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "commit", "-q", "--allow-empty", "-m", "base")
    base_sha = _git(repo, "rev-parse", "HEAD")
    _git(repo, "commit", "-q", "--allow-empty", "-m", "head")
    head_sha = _git(repo, "rev-parse", "HEAD")

    db = str(tmp_path / "store.sqlite")
    base = run_document(seed=1, commit=base_sha)
    slow = run_document(seed=3, slow={"triton_chunk": 1.10}, commit=head_sha)
    same = run_document(seed=2, commit=head_sha)
    with session_scope(get_engine(db)) as session:
        for doc in (base, slow):
            ingest_document(session, doc)
    try:
        assert _cli("gate", "--base", base.run_id, "--head", slow.run_id, "--db", db) == 1
        assert _cli("gate", "--base", base.run_id[:10], "--head", slow.run_id, "--db", db) == 1
        monkeypatch.chdir(repo)
        # The base named by a git ref: the newest run stored for that commit.
        assert _cli("gate", "--base", "HEAD~1", "--head", slow.run_id, "--db", db) == 1
        assert _cli("gate", "--base", "main~1", "--head", _write(tmp_path, "same.json", same), "--db", db) == 3
        assert load_run(base_sha[:12], db_url=db).run_id == base.run_id
        assert _cli("gate", "--base", "no-such-branch", "--head", slow.run_id, "--db", db) == 2
        assert _cli("gate", "--base", "0" * 40, "--head", slow.run_id, "--db", db) == 2
        # A head stored for the commit its base ref names is never its own base: base == head is bad input, and a
        # commit resolves to its newest run other than the head's.
        assert _cli("gate", "--base", slow.run_id, "--head", slow.run_id, "--db", db) == 2
        assert _cli("gate", "--base", "HEAD", "--head", slow.run_id, "--db", db) == 2  # no other run of HEAD
        with session_scope(get_engine(db)) as session:
            ingest_document(session, same)
        assert load_run("HEAD", db_url=db, prefer=slow).run_id == same.run_id
        assert load_run("HEAD", db_url=db, prefer=same).run_id == slow.run_id
    finally:
        dispose_engines()


def test_history_in_the_database_sets_the_noise_bound(tmp_path: Path) -> None:
    """Five stored runs whose levels wander by ~8% (run effects on a loaded machine): a head 10% off the base run is
    within the history's run-to-run noise; with no history (files only) the reason says the spread is unknown."""
    from deltabench.db.engine import dispose_engines, get_engine, session_scope
    from deltabench.db.ingest import ingest_document

    db = str(tmp_path / "store.sqlite")
    levels = (1.0, 1.08, 0.93, 1.05, 0.97)
    runs = [run_document(seed=10 + i, slow={"triton_chunk": lv}, machine_kind="cpu") for i, lv in enumerate(levels)]
    head = run_document(seed=20, slow={"triton_chunk": 0.97 * 1.10}, machine_kind="cpu")
    with session_scope(get_engine(db)) as session:
        for doc in (*runs, head):
            ingest_document(session, doc)
    try:
        out = tmp_path / "cmp.json"
        # A history whose levels wander by ~8% cannot see a 5% change: unknown (exit 3), with what it could see.
        assert _cli("gate", "--base", runs[-1].run_id, "--head", head.run_id, "--db", db, "--json", str(out)) == 3
        rows = [r for r in json.loads(out.read_text())["rows"] if r["impl"] == "triton_chunk"]
        assert all(r["stats"]["spread_source"] == "history" and r["stats"]["history_runs"] == 5 for r in rows)
        assert all(r["verdict"] == "unknown" and r["stats"]["min_detectable_change"] > 0.15 for r in rows)
        # The history's centre is the geometric mean of each run's best sample (the run level), not of medians.
        for r in rows:
            bests = [
                min(j.timing.samples_ms)
                for d in runs
                for j in d.jobs
                if j.impl == "triton_chunk" and j.case.shape_id == r["shape"] and j.case.mode == r["mode"]
            ]
            assert r["stats"]["reference_ms"] == pytest.approx(float(np.exp(np.mean(np.log(bests)))))
        assert all("within run-to-run noise" in r["reason"] for r in rows)
        files = [_write(tmp_path, f"{n}.json", d) for n, d in (("b", runs[-1]), ("h", head))]
        assert _cli("gate", "--base", files[0], "--head", files[1], "--json", str(out)) == 3
        rows = [r for r in json.loads(out.read_text())["rows"] if r["impl"] == "triton_chunk"]
        assert all(r["reason"].startswith("within noise: run-to-run spread unknown") for r in rows)
    finally:
        dispose_engines()


def test_a_head_missing_jobs_or_cut_short_fails_unless_allowed(files: dict[str, str], tmp_path: Path) -> None:
    head = run_document(seed=2)
    partial = head.model_copy(update={"jobs": head.jobs[:-1], "meta": {"complete": False}})
    path = _write(tmp_path, "partial.json", partial)
    md = tmp_path / "partial.md"
    assert _cli("gate", "--base", files["base"], "--head", path, "--markdown", str(md)) == 1
    text = md.read_text()
    assert "cut short" in text and "1 missing in head (a failure; --allow-missing accepts it)" in text
    assert _cli("gate", "--base", files["base"], "--head", path, "--allow-missing", "--default-spread", "1%") == 0
    assert _cli("compare", files["base"], path) == 0
    whole_but_cut = _write(tmp_path, "cut.json", head.model_copy(update={"meta": {"complete": False}}))
    assert _cli("gate", "--base", files["base"], "--head", whole_but_cut) == 1


def test_a_blind_cpu_gate_is_unknown_never_pass(tmp_path: Path) -> None:
    """The README's first gate: one CPU run a side, no history. A head 3x slower is within the assumed default
    spread's bound, so the gate cannot tell: UNKNOWN, exit 3, the summary saying what it could have missed and what
    would resolve it; never PASS."""
    base = _write(tmp_path, "base.json", run_document(seed=1, machine_kind="cpu"))
    slow = _write(tmp_path, "slow.json", run_document(seed=2, machine_kind="cpu", slow={"triton_chunk": 3.0}))
    js, md = tmp_path / "cmp.json", tmp_path / "comment.md"
    assert _cli("gate", "--base", base, "--head", slow, "--json", str(js), "--markdown", str(md)) == 3
    summary = md.read_text().rstrip().splitlines()[-1]
    assert summary.startswith("**UNKNOWN**: 0 same, 0 different, 12 unknown")
    assert "changes up to +1201.6% could go unseen" in summary and "--repeat auto --base-ref" in summary
    data = json.loads(js.read_text())
    assert data["verdict"] == "unknown" and data["failed"] is False
    assert data["max_detectable_change"] > 10.0  # the +1201% bound of the CPU's default spread
    assert all(r["verdict"] == "unknown" and r["stats"]["min_detectable_change"] > 10.0 for r in data["rows"])
