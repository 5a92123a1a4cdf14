"""``deltabench.db.results_frame`` and ``deltabench results --format csv|parquet`` on SQLite and PostgreSQL."""

from __future__ import annotations

import datetime as dt
import io
import pathlib

import pandas as pd
import pytest

from deltabench.cli.app import main
from deltabench.db import results_frame
from deltabench.db.engine import get_engine, session_scope
from deltabench.db.frame import COLUMNS
from deltabench.db.ingest import ingest_document

UTC = dt.timezone.utc


@pytest.fixture
def stored(db_url, factory):  # type: ignore[no-untyped-def]
    """Three runs: an h200 run in January (four jobs, one incorrect), the same in February with a retried job,
    and a CPU run in March."""
    jan = factory.document(created_at=dt.datetime(2026, 1, 10, tzinfo=UTC))
    feb_jobs = [factory.job(impl="torch_chunk", median=1.1, job_id="j1"), factory.job(op="kda", impl="torch_chunk")]
    feb_jobs.append(factory.job(impl="torch_chunk", median=0.9, job_id="j1", attempt=2))
    feb = factory.document(created_at=dt.datetime(2026, 2, 10, tzinfo=UTC), jobs=feb_jobs, commit="b" * 40)
    mar = factory.document(
        created_at=dt.datetime(2026, 3, 10, tzinfo=UTC),
        jobs=[factory.job(impl="torch_recurrent", median=5.0)],
        machine_kind="cpu",
        host="laptop",
        device_name="x86",
    )
    with session_scope(get_engine(db_url)) as session:
        for doc in (jan, feb, mar):
            ingest_document(session, doc)
    return {"jan": jan, "feb": feb, "mar": mar}


def test_one_row_per_job_with_every_field(db_url, stored) -> None:  # type: ignore[no-untyped-def]
    df = results_frame(db_url)
    assert list(df.columns) == list(COLUMNS)
    assert len(df) == 4 + 2 + 1, "the retried job is one row: its latest attempt"
    assert list(df["run_id"]) == [stored["jan"].run_id] * 4 + [stored["feb"].run_id] * 2 + [stored["mar"].run_id]
    jan = stored["jan"]
    first, job = df.iloc[0], jan.jobs[0]
    assert (first.op, first.impl, first["shape"], first["dtype"], first["mode"]) == (
        "gdn",
        "torch_chunk",
        "B2-T1024-H4-K64-V64",
        "bf16",
        "fwd",
    )
    assert (first.B, first["T"], first.H, first.K, first.V, first.seed) == (2, 1024, 4, 64, 64, 7)
    t = job.timing
    assert (first.status, first.median_ms, first.q1_ms, first.q3_ms) == ("ok", t.median_ms, t.q1_ms, t.q3_ms)
    assert first.iqr_ms == pytest.approx(t.q3_ms - t.q1_ms) and first.n_samples == len(t.samples_ms)
    assert first.samples_ms == t.samples_ms, "raw samples, exactly"
    assert (first.clock, first.warmup, bool(first.l2_flush), first.compile_s) == ("cuda_events", 25, True, 1.25)
    assert first.peak_bytes == 123_456_789 and first.peak_mib == pytest.approx(123_456_789 / 2**20)
    assert (first.flops, first["bytes"], first.tflops, first.gbps, first.pct_of_floor) == (1e9, 2e8, 1.0, 200.0, 10.0)
    assert (first.ceiling_matmul_tflops, first.ceiling_copy_gbps) == (692.0, 4220.0)
    env = jan.environment
    assert (first.machine_kind, first.host, first.device_name, first.torch, first.cuda) == (
        "h200",
        env.host,
        env.device_name,
        env.torch,
        env.cuda,
    )
    assert (first.git_commit, bool(first.git_dirty), first.kernel_hash) == ("a" * 40, False, "f00d")
    assert first.run_created_at == pd.Timestamp("2026-01-10", tz="UTC") and first.suite == "train"
    # A job without timing: no figures (missing, not zero), its reason kept.
    bad = df[df.status == "incorrect"].iloc[0]
    assert pd.isna(bad.median_ms) and pd.isna(bad.n_samples) and bad.samples_ms is None and pd.isna(bad.tflops)
    assert bad.reason == "incorrect: rel_fro 0.3 > 0.01"
    # The retried job: its second attempt, where the first stood.
    feb = df[df.run_id == stored["feb"].run_id]
    assert list(feb.attempt) == [2, 1] and feb.iloc[0].median_ms == 0.9
    assert len(results_frame(db_url, all_attempts=True)) == 8


def test_filters(db_url, stored) -> None:  # type: ignore[no-untyped-def]
    runs = {k: d.run_id for k, d in stored.items()}
    assert set(results_frame(db_url, run=runs["feb"][:8]).run_id) == {runs["feb"]}
    assert set(results_frame(db_url, run="latest").run_id) == {runs["mar"]}
    assert set(results_frame(db_url, run=[runs["jan"], runs["mar"]]).run_id) == {runs["jan"], runs["mar"]}
    assert set(results_frame(db_url, op="kda").run_id) == {runs["feb"]}
    assert set(results_frame(db_url, impl=["triton_chunk", "torch_recurrent"]).impl) == {
        "triton_chunk",
        "torch_recurrent",
    }
    assert set(results_frame(db_url, machine_kind="cpu").host) == {"laptop"}
    assert len(results_frame(db_url, status="incorrect")) == 1
    assert set(results_frame(db_url, since="2026-02-01").run_id) == {runs["feb"], runs["mar"]}
    until = dt.datetime(2026, 2, 10, 1, 0, tzinfo=dt.timezone(dt.timedelta(hours=2)))  # 23:00 UTC on the 9th
    assert set(results_frame(db_url, until=until).run_id) == {runs["jan"]}
    assert set(results_frame(db_url, since=dt.date(2026, 2, 1), until="2026-02-28").run_id) == {runs["feb"]}
    assert (
        "samples_ms" in results_frame(db_url, samples=False)
        and results_frame(db_url, samples=False).samples_ms.isna().all()
    )
    empty = results_frame(db_url, op="sdm")
    assert empty.empty and list(empty.columns) == list(COLUMNS)


def test_bad_filters_are_bad_input(db_url, stored) -> None:  # type: ignore[no-untyped-def]
    from deltabench.harness.errors import BadInput

    with pytest.raises(BadInput, match="no run 'nope'"):
        results_frame(db_url, run="nope")
    with pytest.raises(BadInput, match="since: not an ISO date"):
        results_frame(db_url, since="last tuesday")


def test_an_open_session_or_engine_works_too(db_url, stored) -> None:  # type: ignore[no-untyped-def]
    engine = get_engine(db_url)
    assert len(results_frame(engine)) == 7
    with session_scope(engine) as session:
        assert len(results_frame(session, op="gdn")) == 6


def _cli(capsys, *argv: str) -> tuple[int, str, str]:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as exit_info:
        main(list(argv))
    out, err = capsys.readouterr()
    return exit_info.value.code, out, err


def test_results_csv_and_parquet(db_url, stored, tmp_path: pathlib.Path, capsys) -> None:  # type: ignore[no-untyped-def]
    rc, out, _ = _cli(capsys, "results", "--db", db_url, "--run", stored["jan"].run_id, "--format", "csv")
    assert rc == 0
    csv = pd.read_csv(io.StringIO(out))
    assert list(csv.columns) == list(COLUMNS) and len(csv) == 4
    assert list(csv.median_ms.dropna()) == [1.0, 3.0, 0.5]
    rc, out, _ = _cli(capsys, "results", "--db", db_url, "--all", "--op", "gdn", "--format", "csv")
    assert rc == 0 and len(pd.read_csv(io.StringIO(out))) == 6
    pytest.importorskip("pyarrow")
    path = tmp_path / "results.parquet"
    rc, out, err = _cli(capsys, "results", "--db", db_url, "--all", "--format", "parquet", "--out", str(path))
    assert (rc, out, err) == (0, "", "")
    back = pd.read_parquet(path)
    assert list(back.columns) == list(COLUMNS) and len(back) == 7
    assert list(back.iloc[0].samples_ms) == stored["jan"].jobs[0].timing.samples_ms
    assert str(back.run_created_at.dtype) == "datetime64[us, UTC]" or "UTC" in str(back.run_created_at.dtype)
    md = tmp_path / "run.md"
    rc, out, _ = _cli(
        capsys, "results", "--db", db_url, "--run", stored["jan"].run_id, "--format", "markdown", "--out", str(md)
    )
    assert (rc, out) == (0, "") and "| triton_chunk |" in md.read_text()
    rc, _, err = _cli(capsys, "results", "--db", db_url, "--format", "parquet")
    assert rc == 2 and "--format parquet needs --out FILE" in err and err.count("\n") == 1
    rc, _, err = _cli(capsys, "results", "--db", db_url, "--all", "--run", "x", "--format", "csv")
    assert rc == 2 and "--all and --run" in err
    rc, _, err = _cli(capsys, "results", "--db", db_url, "--all", "--format", "markdown")
    assert rc == 2 and "--all and the filters" in err


def test_parquet_without_pyarrow_is_one_line_and_exit_2(sqlite_url, tmp_path: pathlib.Path) -> None:
    import subprocess
    import sys

    # pyarrow made unimportable in a fresh interpreter, as on a machine without it.
    code = "import sys; sys.modules['pyarrow'] = None; from deltabench.cli.app import main; main()"
    argv = ["results", "--db", sqlite_url, "--format", "parquet", "--out", str(tmp_path / "x.parquet")]
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert (
        done.stderr == "deltabench: error: --format parquet needs pyarrow: pip install pyarrow (or 'deltabench[db]')\n"
    )
    assert not (tmp_path / "x.parquet").exists()


def test_the_notebook_guides_pivot_keeps_modes_and_dtypes_apart(db_url, factory, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """docs/guide/notebooks.md's own snippet, run on a store of one shape in fwd and fwd+bwd, fp32 and bf16: four
    rows, each its own median, never their average."""
    import re

    guide = pathlib.Path(__file__).resolve().parents[2] / "docs" / "guide" / "notebooks.md"
    [snippet] = [b for b in re.findall(r"```python\n(.*?)```", guide.read_text(), re.DOTALL) if "pivot_table" in b]
    medians = {("bf16", "fwd"): 1.0, ("bf16", "fwd+bwd"): 3.0, ("fp32", "fwd"): 2.0, ("fp32", "fwd+bwd"): 6.0}
    jobs = [factory.job(dtype=d, mode=m, median=v) for (d, m), v in medians.items()]
    with session_scope(get_engine(db_url)) as session:
        ingest_document(session, factory.document(created_at=dt.datetime(2026, 1, 10, tzinfo=UTC), jobs=jobs))
    monkeypatch.setenv("DELTABENCH_DB", db_url)
    *setup, last = snippet.strip().splitlines()
    scope: dict = {}
    exec("\n".join(setup), scope)
    pivot = eval(last, scope)
    got = {(shape, dtype, mode): v for (shape, dtype, mode), v in pivot["torch_chunk"].items()}
    assert {k[1:]: v for k, v in got.items()} == pytest.approx(medians)
    assert len(got) == 4
