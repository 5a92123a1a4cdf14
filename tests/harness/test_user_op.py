"""A user's op from one --import file (examples/cumdecay_op.py: dims B, T, D, an int64 input without a gradient):
verify, run (stored in SQLite and PostgreSQL), the run and history pages, and gate, all unchanged."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pg_fixtures
import pytest
from fastapi.testclient import TestClient

from deltabench.cli.app import main
from deltabench.db.engine import get_engine, session_scope
from deltabench.db.queries import load_run_document, series_history
from deltabench.harness import document, registry
from deltabench.harness.ops import OPS
from deltabench.web.app import create_app
from deltabench.web.config import Settings

EXAMPLE = str(Path(__file__).resolve().parents[2] / "examples" / "cumdecay_op.py")
SUITE = """
name = "cumdecay"
description = "a user's op"
device = "cpu"
shapes = ["B=2,T=40,D=8"]
dtypes = ["fp32"]
modes = ["fwd", "fwd+bwd"]
timeout_s = 120

[timing]
budget_s = 0.05
min_reps = 5
warmup_s = 0.01
cpu_threads = 1

[gate]
seeds = 1
extra_seed = false

[ops.cumdecay]
impls = ["torch_loop"]
"""
# An impl that ignores the reset flags: the gate must catch it.
NO_RESET = f"""
import runpy
runpy.run_path({EXAMPLE!r})
from deltabench.harness.registry import register_impl

@register_impl("cumdecay", "no_reset", backend="torch", devices=("cpu",), dtypes=("fp32",))
def no_reset(x, g, reset, initial_state=None):
    from deltabench.harness.ops import get_op
    return get_op("cumdecay").oracle(x, g, reset * 0, initial_state=initial_state)[0].to(x.dtype), None
"""

# the shared database fixtures (tests/pg_fixtures.py): a SQLite file and PostgreSQL
# The example's op under another name with two regimes of its own: verify runs those, and only those.
TWO_REGIMES = f"""
import dataclasses, runpy
ns = runpy.run_path({EXAMPLE!r})
from deltabench.harness.ops import register_op
from deltabench.harness.registry import register_impl
register_op(dataclasses.replace(ns["CONTRACT"], name="cumdecay_two", regimes=("long", "typical")))
register_impl("cumdecay_two", "torch_loop", backend="torch", devices=("cpu",), dtypes=("fp32",))(
    ns["cumdecay_torch_loop"]
)
"""

db_url, pg_server, pg_url = pg_fixtures.db_url, pg_fixtures.pg_server, pg_fixtures.pg_url
sqlite_url = pg_fixtures.sqlite_url


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """Run the CLI in-process; returns (exit code, stdout, stderr)."""
    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
    out, err = capsys.readouterr()
    return int(exit_info.value.code or 0), out, err


@pytest.fixture(autouse=True)
def _forget_the_op() -> Iterator[None]:
    """The op and its impls leave the process's registries afterwards (other tests list the ops)."""
    yield
    for op in ("cumdecay", "cumdecay_two"):
        OPS.pop(op, None)
        for key in [k for k in registry._REGISTRY if k[0] == op]:
            del registry._REGISTRY[key]
        document._registered_ops.discard(op)


def test_verify_passes_the_op_and_catches_an_impl_that_ignores_an_index_input(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    code, out, err = run_cli(
        capsys, "verify", "--import", EXAMPLE, "--op", "cumdecay", "--impl", "torch_loop", "--shape", "B=2,T=70,D=8",
        "--seeds", "1", "--json",
    )  # fmt: skip
    assert code == 0, err
    report = json.loads(out)
    checks = {r["check"] for r in report["records"]}
    # the gradients of the float inputs and the state, never of the int64 reset flags
    assert {"output", "final_state", "grad:x", "grad:g", "grad:initial_state", "streaming:output"} <= checks
    assert not any(c.startswith("grad:reset") for c in checks)
    assert report["case"]["D"] == 8 and "H" not in report["case"]

    bad = tmp_path / "no_reset.py"
    bad.write_text(NO_RESET)
    code, out, err = run_cli(
        capsys, "verify", "--import", str(bad), "--op", "cumdecay", "--impl", "no_reset", "--shape", "B=2,T=70,D=8",
        "--mode", "fwd", "--dtype", "fp32", "--seeds", "1", "--json",
    )  # fmt: skip
    assert code == 1, err
    failed = {r["check"] for r in json.loads(out)["records"] if r["gating"] and not r["passed"]}
    assert "output" in failed and "contract" in failed  # wrong values, and no final state returned


def test_verify_runs_an_imported_ops_own_regimes(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    module = tmp_path / "two_regimes.py"
    module.write_text(TWO_REGIMES)
    code, out, err = run_cli(
        capsys, "verify", "--import", str(module), "--op", "cumdecay_two", "--impl", "torch_loop",
        "--shape", "B=1,T=40,D=4", "--dtype", "fp32", "--seeds", "1", "--json",
    )  # fmt: skip
    assert code == 0, err
    report = json.loads(out)
    assert {r["regime"] for r in report["records"] if r["check"] == "output"} == {"long", "typical"}
    assert report["case"]["regime"] == "long"  # the contract's first


def test_a_shape_without_the_ops_dims_is_refused_in_one_line(capsys) -> None:  # type: ignore[no-untyped-def]
    code, _, err = run_cli(
        capsys, "verify", "--import", EXAMPLE, "--op", "cumdecay", "--impl", "torch_loop", "--shape", "B=2,T=70,H=8"
    )
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "unknown dimension H for op cumdecay: dims are B, T, D" in err


def test_run_stores_the_op_and_the_pages_and_the_gate_read_it(capsys, tmp_path, db_url) -> None:  # type: ignore[no-untyped-def]
    suite = tmp_path / "cumdecay.toml"
    suite.write_text(SUITE)
    runs = []
    for name in ("base", "head"):
        out = tmp_path / f"{name}.json"
        code, _, err = run_cli(
            capsys, "run", "--import", EXAMPLE, "--suite", str(suite), "--db", db_url, "--out", str(out), "-q"
        )
        assert code == 0, err
        runs.append(json.loads(out.read_text()))
    doc = runs[1]
    assert doc["schema_version"] == 2
    case = doc["jobs"][0]["case"]
    assert (case["B"], case["T"], case["H"], case["extra_dims"]) == (2, 40, None, {"D": 8})
    assert all(job["status"] == "ok" for r in runs for job in r["jobs"])

    with session_scope(get_engine(db_url)) as session:
        stored = load_run_document(session, doc["run_id"])
        assert [j.case.shape_id for j in stored.jobs] == ["B2-T40-D8", "B2-T40-D8"]
        history = series_history(
            session, op="cumdecay", impl="torch_loop", shape="B2-T40-D8", dtype="fp32", mode="fwd", machine_kind="cpu"
        )
        assert [p.run_id for p in history] == [r["run_id"] for r in runs]

    client = TestClient(create_app(Settings(db_url=db_url)))
    page = client.get(f"/runs/{doc['run_id']}")
    assert page.status_code == 200
    assert "cumdecay" in page.text and "Decayed cumulative sum" in page.text and "B2-T40-D8" in page.text
    query = "op=cumdecay&impl=torch_loop&shape=B2-T40-D8&dtype=fp32&mode=fwd&machine=cpu"
    series = client.get(f"/history?{query}")
    assert series.status_code == 200 and "B2-T40-D8" in series.text

    # Two runs' timings of a microsecond op on a loaded CI machine differ by more than any spread a gate should
    # allow, so the passing comparison reads the head against a copy of itself: what this test checks is that the
    # gate reads the user's op from the documents, not how noisy the machine is.
    head = tmp_path / "head.json"
    base = tmp_path / "same-code.json"
    base.write_text(json.dumps({**json.loads(head.read_text()), "run_id": "same-code-base"}))
    code, out, err = run_cli(
        capsys, "gate", "--import", EXAMPLE, "--base", str(base), "--head", str(head), "--no-history",
        "--default-spread", "5%", "--unknown", "pass",
    )  # fmt: skip
    assert code == 0, out + err
    assert "cumdecay" in out
    # the same head made 3x slower: the gate fails it
    slow = json.loads(head.read_text())
    for job in slow["jobs"]:
        t = job["timing"]
        t["samples_ms"] = [3 * s for s in t["samples_ms"]]
        for key in ("median_ms", "q1_ms", "q3_ms", "mean_ms", "stdev_ms"):
            t[key] = 3 * t[key]
    slow["run_id"] = "slow-head"
    (tmp_path / "slow.json").write_text(json.dumps(slow))
    code, out, err = run_cli(
        capsys, "gate", "--import", EXAMPLE, "--base", str(base), "--head", str(tmp_path / "slow.json"),
        "--no-history", "--default-spread", "5%",
    )  # fmt: skip
    assert code == 1, out + err
    assert "cumdecay" in out and "regress" in out.lower()
