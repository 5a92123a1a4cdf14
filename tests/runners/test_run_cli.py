"""`deltabench run` end to end on the CPU: real subprocesses, the real gate, a real SQLite file.

One tiny suite holds a right impl and planted faults: the wrong one ends `incorrect` with its records and
no timing, the raising one and the segfaulting one end `failed`, the CUDA-only one `unsupported`; the run
completes, exits 1, writes its document and stores it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from deltabench.cli.app import main
from deltabench.harness.document import ResultDocument

PLANTED = str(Path(__file__).with_name("planted_impls.py"))

SUITE = """
name = "faults"
device = "cpu"
shapes = ["B=1,T=20,H=1,K=8,V=8"]
dtypes = ["fp32"]
modes = ["fwd"]
timeout_s = 120
[timing]
budget_s = 0.05
min_reps = 3
warmup_s = 0.02
[gate]
seeds = 1
extra_seed = false
[ops.gdn]
impls = ["torch_chunk", "planted_wrong", "planted_raise", "planted_segfault", "planted_cuda_only"]
baseline = "torch_chunk"
"""


@pytest.fixture(scope="module")
def faulty_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("run")
    suite = tmp / "faults.toml"
    suite.write_text(SUITE)
    out, db = tmp / "results.json", tmp / "store.db"
    argv = ["run", "--suite", str(suite), "--import", PLANTED, "--out", str(out), "--db", str(db)]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    doc = ResultDocument.from_json(out.read_text())
    return exit_info.value.code, doc, db


def _job(doc: ResultDocument, impl: str):
    (job,) = [j for j in doc.jobs if j.impl == impl]
    return job


def test_run_exits_1_and_completes_every_job(faulty_run):
    code, doc, _ = faulty_run
    assert code == 1
    assert doc.meta["complete"] is True
    assert [j.impl for j in doc.jobs] == [
        "torch_chunk",
        "planted_wrong",
        "planted_raise",
        "planted_segfault",
        "planted_cuda_only",
    ]
    assert doc.suite == "faults" and doc.baselines == {"gdn": "torch_chunk"}
    assert doc.environment.machine_kind == "cpu"
    assert doc.ceilings["matmul_tflops"] > 0 and doc.ceilings["copy_gbps"] > 0


def test_right_impl_is_gated_timed_and_placed_against_the_ceilings(faulty_run):
    job = _job(faulty_run[1], "torch_chunk")
    assert job.status == "ok", job.reason
    assert job.verification and all(r.passed for r in job.verification if r.gating)
    assert job.gate_reference  # the gate names what it compared against
    t = job.timing
    assert t.clock == "cpu_monotonic" and len(t.samples_ms) >= 3 and t.median_ms > 0
    assert t.q1_ms <= t.median_ms <= t.q3_ms and t.compile_s is not None and t.stop_reason
    assert job.work.flops > 0 and job.work.tflops > 0 and job.work.pct_of_floor > 0
    assert job.memory is not None and "RSS" in job.memory.method


def test_wrong_impl_is_incorrect_with_records_and_no_timing(faulty_run):
    job = _job(faulty_run[1], "planted_wrong")
    assert job.status == "incorrect"
    assert job.timing is None and job.memory is None
    failed = [r for r in job.verification if r.gating and not r.passed]
    assert any(r.check.startswith("output") for r in failed)
    assert job.reason.startswith("failed the gate")


def test_raising_and_crashing_impls_fail_with_their_message(faulty_run):
    raised = _job(faulty_run[1], "planted_raise")
    assert raised.status == "failed"
    assert "RuntimeError: planted failure: kernel launch refused" in raised.reason
    crashed = _job(faulty_run[1], "planted_segfault")
    assert crashed.status == "failed"
    assert "SIGSEGV" in crashed.reason
    # The crashing frame, innermost first (as verify quotes it), not the bottom of the stack (the job's main).
    words = crashed.reason.split("Fatal Python error: Segmentation fault | ", 1)[1]
    assert words.startswith('File "') and "string_at" in words and "job_main" not in words, crashed.reason
    assert raised.timing is None and crashed.timing is None


def test_impl_that_cannot_run_here_is_unsupported_with_its_reason(faulty_run):
    job = _job(faulty_run[1], "planted_cuda_only")
    assert job.status == "unsupported"
    assert "runs on cuda, not cpu" in job.reason


def test_run_is_stored_in_the_database(faulty_run):
    from deltabench.db.engine import get_engine, session_scope
    from deltabench.db.queries import load_run_document

    _, doc, db = faulty_run
    with session_scope(get_engine(str(db))) as session:
        stored = load_run_document(session, doc.run_id)
    assert [j.status for j in stored.jobs] == [j.status for j in doc.jobs]
    assert stored.jobs[0].timing.samples_ms == doc.jobs[0].timing.samples_ms


def test_unknown_suite_is_bad_input(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--suite", "no-such-suite", "--no-db"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "unknown suite 'no-such-suite'" in err and "smoke" in err
    assert len(err.strip().splitlines()) == 1


def test_results_document_is_valid_json(faulty_run):
    text = faulty_run[1].to_json()
    assert json.loads(text)["schema_version"] == 2


FRAGILE_SUITE = """
name = "fragile"
device = "cpu"
dtypes = ["fp32"]
modes = ["fwd"]
timeout_s = 120
{isolation}
[timing]
budget_s = 0.3
min_reps = 3
warmup_s = 0.02
[gate]
seeds = 1
extra_seed = false
[ops.gdn]
impls = ["planted_fragile", "torch_chunk"]
baseline = "torch_chunk"
shapes = {shapes}
"""


def _run_in_terminal(argv: list[str], timeout_s: float = 300) -> tuple[int, str]:
    """Run ``deltabench ARGV`` with stdout and stderr on a pseudo-terminal: (exit code, everything it drew)."""
    import os
    import pty
    import subprocess
    import sys

    primary, secondary = pty.openpty()
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "160"}
    code = "import sys; from deltabench.cli.app import main; main(sys.argv[1:])"
    proc = subprocess.Popen([sys.executable, "-c", code, *argv], stdout=secondary, stderr=secondary, env=env)
    os.close(secondary)
    chunks = []
    while True:
        try:
            data = os.read(primary, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(primary)
    drawn = b"".join(chunks).decode(errors="replace")
    return proc.wait(timeout_s), re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", drawn)  # without colours and cursor moves


def test_a_crash_mid_worker_costs_one_job_and_the_terminal_shows_live_progress(tmp_path):
    suite = tmp_path / "fragile.toml"
    suite.write_text(
        FRAGILE_SUITE.format(
            isolation="", shapes='["B=1,T=20,H=1,K=8,V=8", "B=1,T=40,H=1,K=8,V=8", "B=1,T=24,H=1,K=8,V=8"]'
        )
    )
    out = tmp_path / "out.json"
    code, drawn = _run_in_terminal(["run", "--suite", str(suite), "--import", PLANTED, "--out", str(out), "--no-db"])
    assert code == 1, drawn
    doc = ResultDocument.from_json(out.read_text())
    # Listed in the suite's order although planted_fragile's three jobs ran first, back to back.
    assert [(j.impl, j.case.T, j.status) for j in doc.jobs] == [
        ("planted_fragile", 20, "ok"),
        ("torch_chunk", 20, "ok"),
        ("planted_fragile", 40, "failed"),
        ("torch_chunk", 40, "ok"),
        ("planted_fragile", 24, "ok"),
        ("torch_chunk", 24, "ok"),
    ]
    assert "SIGSEGV" in doc.jobs[2].reason
    assert "ETA" in drawn and "/6" in drawn
    assert "planted_fragile B1-T24-H1-K8-V8 fp32 fwd: timing" in drawn  # the current job and its phase


def test_quiet_and_job_isolation(tmp_path):
    suite = tmp_path / "one.toml"
    suite.write_text(FRAGILE_SUITE.format(isolation='isolation = "job"', shapes='["B=1,T=20,H=1,K=8,V=8"]'))
    code, drawn = _run_in_terminal(
        ["run", "--suite", str(suite), "--import", PLANTED, "--impl", "torch_chunk", "--no-db", "-q"]
    )
    assert code == 0, drawn
    assert "ETA" not in drawn and "jobs: 1 ok" in drawn
    suite.write_text(FRAGILE_SUITE.format(isolation='isolation = "thread"', shapes='["B=1,T=20,H=1,K=8,V=8"]'))
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--suite", str(suite), "--import", PLANTED, "--no-db"])
    assert exit_info.value.code == 2


def test_a_suite_narrows_the_gate_regimes(tmp_path):
    """``[gate] regimes`` reaches the runner's gate: the job's records and its reference sentence name only
    the regimes asked for, where the default gate runs all three."""
    suite = tmp_path / "narrow.toml"
    body = (
        'name = "narrow"\nshapes = ["B=1,T=20,H=1,K=8,V=8"]\ndtypes = ["fp32"]\nmodes = ["fwd"]\n'
        '[gate]\nseeds = 1\n{regimes}\n[ops.gdn]\nimpls = ["torch_chunk"]\n'
    )
    seen = {}
    for label, line in (("narrow", 'regimes = ["long"]'), ("default", "")):
        suite.write_text(body.format(regimes=line))
        out = tmp_path / f"{label}.json"
        with pytest.raises(SystemExit) as exit_info:
            main(["run", "--suite", str(suite), "--no-db", "-q", "--out", str(out)])
        assert exit_info.value.code == 0
        job = ResultDocument.from_json(out.read_text()).jobs[0]
        assert job.status == "ok", job.reason
        seen[label] = ({r.regime for r in job.verification if r.regime}, job.gate_reference)
    assert seen["narrow"][0] == {"long"} and "regimes long;" in seen["narrow"][1]
    assert seen["default"][0] == {"typical", "long", "strong"}


def test_an_unreachable_store_is_refused_before_the_first_job(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """The store is reached first: exit 2 with one line, no job run (it used to run the whole suite, then exit 2
    without saying where the results were)."""
    suite = tmp_path / "faults.toml"
    suite.write_text(SUITE.replace('"planted_wrong", "planted_raise", "planted_segfault", "planted_cuda_only"', ""))
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--suite", str(suite), "--db", "postgresql+psycopg://postgres@127.0.0.1:1/nowhere", "-q"])
    out, err = capsys.readouterr()
    assert exit_info.value.code == 2 and out == "", out
    assert len(err.strip().splitlines()) == 1 and "Connection refused" in err, err
    assert "partial document" not in err


def test_ctrl_c_says_how_many_jobs_were_saved_and_where(tmp_path: Path) -> None:
    """Interrupted, the run names its partial document, how many of its jobs it holds, and how to store it."""
    import os
    import signal
    import subprocess
    import sys
    import time

    suite = tmp_path / "slow.toml"
    # Enough jobs (each gated and timed, ~0.2 s) that the signal, sent once the first has ended, lands mid-run.
    many = "shapes = [" + ", ".join(f'"B=1,T={20 * i},H=1,K=8,V=8"' for i in range(1, 31)) + "]"
    text = SUITE.replace('"planted_wrong", "planted_raise", "planted_segfault", "planted_cuda_only"', "")
    suite.write_text(text.replace('shapes = ["B=1,T=20,H=1,K=8,V=8"]', many))
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "PYTHONUNBUFFERED": "1"}
    argv = [
        sys.executable,
        "-c",
        "from deltabench.cli.app import main; main()",
        "run",
        "--suite",
        str(suite),
        "--no-db",
    ]
    with open(tmp_path / "err.log", "w") as log:
        # A shell's background job (CI started with `&`) ignores SIGINT, and so would the run it starts: the child
        # takes the default disposition back, as a run started from a terminal has it.
        default_sigint = lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=log, preexec_fn=default_sigint)
        deadline = time.monotonic() + 120
        while "[1/30]" not in (tmp_path / "err.log").read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    err = (tmp_path / "err.log").read_text()
    found = re.search(r"interrupted: (\d+) of (\d+) jobs saved in (\S+) \(incomplete\); `deltabench ingest \3`", err)
    assert found, err[-2000:]
    assert int(found.group(2)) == 30 and 1 <= int(found.group(1)) < 30 and Path(found.group(3)).is_file()
    assert proc.returncode == 130, err[-1000:]
