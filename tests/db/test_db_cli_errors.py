"""The CLI on bad documents and bad databases: one line and exit code 2, nothing stored, no store created; and
``deltabench runs delete``. On SQLite and PostgreSQL."""

from __future__ import annotations

import json
import math
import pathlib

import pytest
from sqlalchemy import func, select

from deltabench.cli.app import main
from deltabench.db.engine import get_engine, session_scope
from deltabench.db.models import Result, Run


def _cli(capsys, *argv: str) -> tuple[int, str, str]:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as exit_info:
        main(list(argv))
    out, err = capsys.readouterr()
    return exit_info.value.code, out, err


def _count(url: str, model) -> int:  # type: ignore[no-untyped-def]
    with session_scope(get_engine(url)) as s:
        return s.scalar(select(func.count()).select_from(model))


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda d: d["jobs"][0]["timing"].update(median_ms=math.inf), "jobs.0.timing: Value error, a timing must be"),
        (lambda d: d["jobs"][0]["timing"].update(samples_ms=[1.0, math.nan]), "samples_ms[1] must be finite"),
        (lambda d: d["jobs"][0].update(timing=None), "status 'ok' needs a timing"),
        (lambda d: d["jobs"][3].update(timing=d["jobs"][0]["timing"]), "status 'incorrect' carries no timing"),
        (lambda d: d["jobs"][0]["case"].update(op="nope"), "bad.json: unknown op 'nope': give the command --import"),
        (lambda d: d.update(schema_version=999), "schema_version: Input should be less than or equal to 2"),
        (lambda d: d.update(created_at="9999-01-01T00:00:00Z"), "created_at: Value error, created_at 9999"),
        (lambda d: d.update(created_at="0001-01-01T00:00:00Z"), "created_at 0001-01-01T00:00:00+00:00 is before 2020"),
        (lambda d: d.update(run_id="a/b"), "run_id: Value error, 'a/b' is not a valid id"),
        (lambda d: d.update(run_id="latest"), "run_id: Value error, 'latest' is reserved"),
    ],
    ids=[
        "inf",
        "nan-sample",
        "ok-no-timing",
        "incorrect-timed",
        "op",
        "schema",
        "future",
        "past",
        "slash-id",
        "latest",
    ],
)
def test_ingest_refuses_a_bad_document_in_one_line(db_url, factory, tmp_path, capsys, change, words) -> None:  # type: ignore[no-untyped-def]
    good = json.loads(factory.document().to_json())
    bad = json.loads(factory.document().to_json())
    change(bad)
    (tmp_path / "good.json").write_text(json.dumps(good))
    (tmp_path / "bad.json").write_text(json.dumps(bad, allow_nan=True))
    rc, out, err = _cli(capsys, "ingest", str(tmp_path / "good.json"), str(tmp_path / "bad.json"), "--db", db_url)
    assert rc == 2 and out == "", err
    assert len(err.strip().splitlines()) == 1 and words in err, err
    assert _count(db_url, Run) == 0 and _count(db_url, Result) == 0  # the good file is not stored either


def test_database_errors_are_one_line(tmp_path: pathlib.Path, capsys) -> None:  # type: ignore[no-untyped-def]
    cases = {
        "postgresql+psycopg://postgres:secret@127.0.0.1:1/test": "Connection refused",
        "mysql://user:pw@localhost/db": "deltabench stores in SQLite",
        "notaurl://": "",
    }
    for url, words in cases.items():
        for argv in (["results", "--db", url], ["ingest", str(tmp_path / "x.json"), "--db", url]):
            if argv[0] == "ingest":
                (tmp_path / "x.json").write_text("[]")
            rc, _out, err = _cli(capsys, *argv)
            assert rc == 2 and len(err.strip().splitlines()) == 1, (url, err)
            assert "secret" not in err and "pw@" not in err, err
            if argv[0] == "results":
                assert err.startswith("deltabench: error: database ") and words in err, err


def test_read_commands_never_create_a_store(tmp_path: pathlib.Path, capsys, pg_server) -> None:  # type: ignore[no-untyped-def]
    typo = tmp_path / "typo" / "dir" / "x.db"
    for argv in (
        ["results", "--db", str(typo)],
        ["token", "list", "--db", str(typo)],
        ["runs", "delete", "r1", "--db", str(typo)],
    ):
        rc, _, err = _cli(capsys, *argv)
        assert rc == 2 and "no such file" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "typo").exists()
    empty_pg = pg_server()
    rc, _, err = _cli(capsys, "results", "--db", empty_pg)
    assert rc == 2 and "holds no deltabench store" in err, err
    from sqlalchemy import create_engine, inspect

    engine = create_engine(empty_pg)
    assert inspect(engine).get_table_names() == []
    engine.dispose()


def test_runs_delete(db_url, factory, tmp_path: pathlib.Path, capsys) -> None:  # type: ignore[no-untyped-def]
    keep, mistake = factory.document(), factory.document()
    for doc in (keep, mistake):
        (tmp_path / f"{doc.run_id}.json").write_text(doc.to_json())
        assert _cli(capsys, "ingest", str(tmp_path / f"{doc.run_id}.json"), "--db", db_url)[0] == 0
    rc, out, err = _cli(capsys, "runs", "delete", mistake.run_id[:6], "--db", db_url)
    assert rc == 2 and "no run" in err  # an exact id only, never a prefix
    rc, out, err = _cli(capsys, "runs", "delete", mistake.run_id, "--db", db_url)
    assert (rc, out) == (0, f"deleted run {mistake.run_id} (4 results)\n"), err
    assert _count(db_url, Run) == 1 and _count(db_url, Result) == 4
    rc, out, err = _cli(capsys, "runs", "delete", mistake.run_id, "--db", db_url)
    assert rc == 2 and len(err.strip().splitlines()) == 1


def test_results_says_a_run_is_incomplete(db_url, factory, tmp_path: pathlib.Path, capsys) -> None:  # type: ignore[no-untyped-def]
    doc = factory.document()
    doc.meta["complete"] = False
    (tmp_path / "partial.json").write_text(doc.to_json())
    assert _cli(capsys, "ingest", str(tmp_path / "partial.json"), "--db", db_url)[0] == 0
    rc, _out, err = _cli(capsys, "results", "--run", doc.run_id, "--db", db_url)
    assert rc == 0 and f"run {doc.run_id} is incomplete" in err
