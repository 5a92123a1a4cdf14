"""`deltabench run --base-ref REF` end to end: the base code of a git ref and the head run interleaved job by job
in one invocation (real worker processes, real git repositories in a temporary folder), and `deltabench gate` on
the two documents.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from deltabench.cli.app import main
from deltabench.harness.document import ResultDocument
from deltabench.harness.suites import load_suite
from deltabench.runners.environment import kernel_hash, source_root
from deltabench.runners.interleave import BaseTree, base_imports, interleave_order
from deltabench.runners.session import plan_run

REPEAT = 5

# A user's impl file: gdn's chunked PyTorch kernel with SLOW times its own time of busy work after each call.
USER_IMPL = """
import time

from deltabench.harness.registry import register_impl
from deltabench.kernels.gdn.torch.torch_chunk import gdn_torch_chunk

SLOW = {slow}


@register_impl("gdn", "user_chunk", backend="torch", devices=("cpu",), dtypes=("fp32",))
def user_chunk(q, k, v, g, beta, scale=None, initial_state=None):
    t0 = time.perf_counter()
    out = gdn_torch_chunk(q, k, v, g, beta, scale=scale, initial_state=initial_state)
    end = time.perf_counter() + SLOW * (time.perf_counter() - t0)
    while time.perf_counter() < end:
        pass
    return out
"""


def _cli(*args: str) -> int:
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    return int(exc.value.code)


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def _new_repo(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    _git(path, "init", "-q")
    return path


def _commit(repo: Path, message: str) -> str:
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", message)
    return _git(repo, "rev-parse", "HEAD")


def test_interleave_order_alternates_which_side_goes_first(tmp_path: Path, tiny_suite: Callable[..., Path]) -> None:
    suite = load_suite(str(tiny_suite(tmp_path / "suite.toml")))
    plan = plan_run(suite, device="cpu", repeat=4)
    plan.jobs = plan.jobs * 3  # three jobs of one impl
    order = interleave_order(plan)
    assert [(r, i) for r, i, _ in order] == [(r, i) for r in range(4) for i in range(3)]
    firsts = [b for _, _, b in order]
    assert firsts[:6] == [True, False, True, False, True, False]  # ABBA over rounds and over jobs
    assert sum(firsts) == len(order) // 2


def test_import_files_of_the_repository_come_from_the_base_tree(tmp_path: Path) -> None:
    repo = _new_repo(tmp_path / "repo")
    root = tmp_path / "tree"
    (root / "impls").mkdir(parents=True)
    (root / "impls" / "old.py").write_text("")
    (repo / "impls").mkdir()
    for name in ("old.py", "new.py"):
        (repo / "impls" / name).write_text("")
    outside = tmp_path / "elsewhere.py"
    outside.write_text("")
    tree = BaseTree(ref="HEAD", commit="0" * 40, repo=repo.resolve(), root=root, shim=None)
    specs = [str(repo / "impls" / "old.py"), str(repo / "impls" / "new.py"), str(outside), "some.module"]
    assert base_imports(specs, tree) == [str(root / "impls" / "old.py"), str(outside), "some.module"]


def test_bad_base_ref_or_no_checkout_is_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tiny_suite: Callable[..., Path]
) -> None:
    suite = tiny_suite(tmp_path / "suite.toml")
    repo = _new_repo(tmp_path / "repo")
    (repo / "a.txt").write_text("a")
    _commit(repo, "a")
    monkeypatch.chdir(repo)
    assert _cli("run", "--suite", str(suite), "--base-ref", "no-such-branch", "--no-db", "-q") == 2
    err = capsys.readouterr().err
    assert "--base-ref 'no-such-branch': no such commit" in err and len(err.strip().splitlines()) == 1
    plain = tmp_path / "plain"
    plain.mkdir()
    monkeypatch.chdir(plain)
    assert _cli("run", "--suite", str(suite), "--base-ref", "HEAD", "--no-db", "-q") == 2
    assert "is not inside a git checkout" in capsys.readouterr().err
    assert _cli("run", "--suite", str(suite), "--base-out", str(tmp_path / "b.json"), "--no-db", "-q") == 2
    assert "--base-out needs --base-ref" in capsys.readouterr().err


def test_the_base_side_runs_the_base_commits_deltabench(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_suite: Callable[..., Path]
) -> None:
    """A copy of deltabench's source whose base commit doubles gdn torch_chunk's output: the base side's job fails
    its correctness gate (its worker ran the base kernel), the head's passes, each document names its own code."""
    repo = _new_repo(tmp_path / "deltabench")
    checkout = source_root().parents[1]  # src/deltabench -> the repository's root
    archive = subprocess.run(["git", "-C", str(checkout), "archive", "HEAD"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(repo)], input=archive.stdout, check=True)
    kernel = repo / "src" / "deltabench" / "kernels" / "gdn" / "torch" / "torch_chunk.py"
    text = kernel.read_text()
    original, planted = "return merge_chunks(o, T), final_state", "return 2 * merge_chunks(o, T), final_state"
    assert text.count(original) == 1
    kernel.write_text(text.replace(original, planted))
    base_commit = _commit(repo, "base with a planted error")
    suite = tiny_suite(tmp_path / "suite.toml")
    monkeypatch.chdir(repo)
    out = tmp_path / "head.json"
    code = _cli("run", "--suite", str(suite), "--repeat", "2", "--base-ref", "HEAD", "--out", str(out), "--no-db", "-q")
    assert code == 0  # the head's jobs decide the exit code
    head = ResultDocument.from_json(out.read_text())
    base = ResultDocument.from_json((tmp_path / "head.base.json").read_text())
    (hj,), (bj,) = head.jobs, base.jobs
    assert hj.status == "ok" and hj.timing is not None and hj.timing.n_repetitions == 2
    assert bj.status == "incorrect" and bj.timing is None and bj.verification
    assert base.environment.git_commit == base_commit and head.environment.git_commit != base_commit
    assert base.environment.kernel_hash == kernel_hash(repo / "src" / "deltabench") != head.environment.kernel_hash
    assert head.meta["interleaved_with"] == base.run_id and base.meta["interleaved_with"] == head.run_id
    assert (head.meta["side"], base.meta["side"]) == ("head", "base")


@pytest.fixture(scope="module")
def user_project(tmp_path_factory: pytest.TempPathFactory, tiny_suite: Callable[..., Path]) -> Path:
    """A user's repository holding an impl file (no slowdown) at its HEAD commit, its suite beside it."""
    repo = _new_repo(tmp_path_factory.mktemp("project") / "project")
    tiny_suite(repo.parent / "suite.toml", "user_chunk")
    (repo / "my_impl.py").write_text(USER_IMPL.format(slow=0.0))
    _commit(repo, "user impl")
    return repo


def _interleaved(
    repo: Path, name: str, monkeypatch: pytest.MonkeyPatch, repeat: tuple[str, ...] = ("--repeat", str(REPEAT))
) -> tuple[int, dict]:
    """Run the user suite interleaved against HEAD from `repo` (`repeat`: its repetition options), gate it; (gate
    exit code, its one row)."""
    suite = repo.parent / "suite.toml"  # user_project's
    out = repo.parent / f"{name}.json"
    monkeypatch.chdir(repo)
    args = ["run", "--suite", str(suite), "--import", "my_impl.py", *repeat, "--base-ref", "HEAD"]
    db = str(repo.parent / f"{name}.db")
    assert _cli(*args, "--out", str(out), "--db", db, "-q") == 0
    cmp = repo.parent / f"{name}.cmp.json"
    base = out.with_name(f"{name}.base.json")
    # Both runs are stored; the lean comparison input the dashboard reads knows they were interleaved too.
    from deltabench.db.engine import dispose_engines, get_engine, session_scope
    from deltabench.db.queries import load_comparison_input
    from deltabench.regression import compare_documents

    ids = [ResultDocument.from_json(p.read_text()).run_id for p in (base, out)]
    try:
        with session_scope(get_engine(db)) as session:
            stored = [load_comparison_input(session, run_id=run_id) for run_id in ids]
    finally:
        dispose_engines()
    assert stored[0].meta["interleaved_with"] == ids[1] and compare_documents(*stored).interleaved
    assert stored[0].meta.get("sequential") == ResultDocument.from_json(base.read_text()).meta.get("sequential")
    code = _cli("gate", "--base", str(base), "--head", str(out), "--json", str(cmp))
    data = json.loads(cmp.read_text())
    assert data["interleaved"] is True
    (row,) = data["rows"]
    return code, row


def test_same_code_interleaved_passes_the_gate(user_project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, row = _interleaved(user_project, "same", monkeypatch)
    # Five repetitions a side see a 5% change only on a quiet machine: same (exit 0) or unknown (exit 3), not 1.
    assert code in (0, 3) and row["verdict"] in ("same", "unknown"), row["reason"]
    assert (code == 0) == (row["stats"]["min_detectable_change"] <= 0.05)
    assert row["stats"]["spread_source"] == "repetitions"
    assert (row["stats"]["base_repetitions"], row["stats"]["head_repetitions"]) == (REPEAT, REPEAT)


def test_a_planted_slowdown_in_the_working_tree_fails_the_gate(
    user_project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The working tree's impl file spends twice its own time again (3x); the base side imports the committed one."""
    impl = user_project / "my_impl.py"
    impl.write_text(USER_IMPL.format(slow=2.0))
    try:
        code, row = _interleaved(user_project, "planted", monkeypatch)
    finally:
        _git(user_project, "checkout", "--", "my_impl.py")
    assert code == 1 and row["outcome"] == "regression", row["reason"]
    assert "interleaved" in row["reason"] and row["stats"]["change"] > 1.5


AUTO = ("--repeat", "auto", "--max-repeat", "10")  # looks at 6 and 10 repetitions: alpha / 2 each


def test_repeat_auto_passes_unchanged_code(user_project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--repeat auto`: unchanged code is never a failure; it ends SAME (exit 0) as soon as a look can see a 5%
    change, else keeps adding repetitions up to the maximum and says how much it could have missed (exit 3). On the
    shared two-core CI machine a job's processes are at times 10% apart, so a 5% change can stay out of reach."""
    code, row = _interleaved(user_project, "auto-same", monkeypatch, AUTO)
    assert code in (0, 3) and row["verdict"] in ("same", "unknown"), row["reason"]
    doc = ResultDocument.from_json((user_project.parent / "auto-same.json").read_text())
    seq = doc.meta["sequential"]
    assert seq["schedule"] == [6, 10] and seq["looks"] == 2 and seq["rounds"] in (6, 10)
    assert row["stats"]["head_repetitions"] == seq["rounds"]
    if code == 3:  # unknown: it used every repetition it was allowed
        assert seq["rounds"] == 10 and row["stats"]["min_detectable_change"] > 0.05


def test_repeat_auto_catches_a_planted_25_percent_slowdown(user_project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The working tree's impl spends a quarter of its own time again: `--repeat auto` at its default schedule
    (looks at 6, 12 and 20 repetitions) and the gate call it a regression (exit 1). Capped at 10 repetitions it
    once ended UNKNOWN on the loaded CI machine (+25.0% seen, +26.7% detectable); simulated fast and slow worker
    processes (benchmarks/cpu/repeat_auto_power.py) miss 2-10 of 40 such slowdowns by 10 repetitions, 0 by 20."""
    impl = user_project / "my_impl.py"
    impl.write_text(USER_IMPL.format(slow=0.25))
    try:
        code, row = _interleaved(user_project, "auto-planted", monkeypatch, ("--repeat", "auto"))
    finally:
        _git(user_project, "checkout", "--", "my_impl.py")
    assert code == 1 and row["outcome"] == "regression" and row["verdict"] == "different", row["reason"]
    cmp = json.loads((user_project.parent / "auto-planted.cmp.json").read_text())
    assert cmp["looks"] == 3 and cmp["alpha"] == pytest.approx(0.01 / 3)  # alpha 0.01 spent over the three looks
    assert row["stats"]["change"] > 0.15


def test_repeat_auto_needs_a_base_ref(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tiny_suite: Callable[..., Path]
) -> None:
    suite = tiny_suite(tmp_path / "suite.toml")
    assert _cli("run", "--suite", str(suite), "--repeat", "auto", "--no-db", "-q") == 2
    assert "--repeat auto needs --base-ref" in capsys.readouterr().err
    assert _cli("run", "--suite", str(suite), "--repeat", "3", "--max-repeat", "9", "--no-db", "-q") == 2
    assert "--max-repeat needs --repeat auto" in capsys.readouterr().err
