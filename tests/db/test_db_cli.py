"""``deltabench ingest`` and ``deltabench results`` end to end, in process, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
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


def test_ingest_prints_run_ids_and_stores_once(db_url, factory, tmp_path: pathlib.Path, capsys) -> None:  # type: ignore[no-untyped-def]
    a, b = factory.document(), factory.document()
    (tmp_path / "a.json").write_text(a.to_json())
    (tmp_path / "both.json").write_text(json.dumps([json.loads(a.to_json()), json.loads(b.to_json())]))
    rc, out, err = _cli(capsys, "ingest", str(tmp_path / "a.json"), "--db", db_url)
    assert (rc, out, err) == (0, f"{a.run_id}\n", "")
    rc, out, _ = _cli(capsys, "ingest", str(tmp_path / "a.json"), str(tmp_path / "both.json"), "--db", db_url, "--json")
    assert rc == 0 and json.loads(out) == {"runs": [a.run_id, b.run_id]}
    assert _count(db_url, Run) == 2 and _count(db_url, Result) == 8


def test_ingest_and_runs_delete_refresh_the_regressions_table_before_returning(  # type: ignore[no-untyped-def]
    db_url, factory, tmp_path: pathlib.Path, capsys
) -> None:
    from deltabench.db import queries, series_state
    from deltabench.db.models import SeriesDirty

    a, b = factory.document(), factory.document(commit="b" * 40)
    (tmp_path / "a.json").write_text(a.to_json())
    (tmp_path / "b.json").write_text(b.to_json())
    assert _cli(capsys, "ingest", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--db", db_url)[0] == 0
    with session_scope(get_engine(db_url)) as s:
        series = queries.list_series(s)
        assert series and _count(db_url, SeriesDirty) == 0, "no series left waiting for the server"
        assert [key for key, _ in series_state.states(s)] == series
    assert _cli(capsys, "runs", "delete", b.run_id, "--db", db_url)[0] == 0
    assert _cli(capsys, "runs", "delete", a.run_id, "--db", db_url)[0] == 0
    with session_scope(get_engine(db_url)) as s:
        assert series_state.states(s) == [] and _count(db_url, SeriesDirty) == 0


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no such file"),
        ("{not json", "not JSON"),
        ('{"run_id": "x"}', "not a valid deltabench result document: environment: Field required"),
        ("[]", "empty list"),
        ("[1]", "not a deltabench result document (a JSON int)"),
    ],
    ids=["missing", "not-json", "wrong-schema", "empty-list", "not-an-object"],
)
def test_ingest_bad_file_is_exit_2_and_stores_nothing(  # type: ignore[no-untyped-def]
    content, message, factory, tmp_path: pathlib.Path, capsys
) -> None:
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(factory.document().to_json())
    if content is not None:
        bad.write_text(content)
    url = str(tmp_path / "cli.db")
    rc, out, err = _cli(capsys, "ingest", str(good), str(bad), "--db", url)
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and message in err and err.startswith("deltabench: error: ")
    assert _count(url, Run) == 0  # the good file before it was not stored either


def test_results_formats_and_run_selection(db_url, factory, tmp_path: pathlib.Path, capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import datetime as dt

    old = factory.document(created_at=dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc))
    new = factory.document(created_at=dt.datetime(2026, 2, 1, tzinfo=dt.timezone.utc))
    for doc in (old, new):
        (tmp_path / f"{doc.run_id}.json").write_text(doc.to_json())
        assert _cli(capsys, "ingest", str(tmp_path / f"{doc.run_id}.json"), "--db", db_url)[0] == 0
    monkeypatch.setenv("DELTABENCH_DB", db_url)  # no --db: the environment variable decides
    rc, out, _ = _cli(capsys, "results", "--format", "json")
    assert rc == 0 and new.run_id in out and old.run_id not in out
    rc, out, _ = _cli(capsys, "results", "--run", old.run_id[:10], "--format", "markdown")
    assert rc == 0 and old.run_id in out and "| triton_chunk |" in out and "incorrect" in out
    rc, out, _ = _cli(capsys, "results", "--run", new.run_id, "--format", "csv")
    assert rc == 0 and out.splitlines()[0].startswith("op,") and len(out.splitlines()) == 5
    rc, out, _ = _cli(capsys, "results", "--run", new.run_id)
    assert rc == 0 and "torch_chunk" in out and "gdn" in out
    rc, _, err = _cli(capsys, "results", "--run", "no-such-run")
    assert rc == 2 and "no run 'no-such-run'" in err
    rc, _, err = _cli(capsys, "results", "--format", "xml")
    assert rc == 2 and "unknown format" in err


def test_results_on_empty_database_is_exit_2(tmp_path: pathlib.Path, capsys) -> None:  # type: ignore[no-untyped-def]
    rc, out, err = _cli(capsys, "results", "--db", str(tmp_path / "empty.db"))
    assert rc == 2 and out == "" and "no such file" in err  # a read never creates the store
    get_engine(str(tmp_path / "empty.db"))  # a store with nothing in it
    rc, out, err = _cli(capsys, "results", "--db", str(tmp_path / "empty.db"))
    assert rc == 2 and out == "" and "no runs are stored" in err
