"""``deltabench runs list``: the stored runs, newest first, as a table or JSON (id, suite, commit, machine, jobs,
complete, created). On SQLite and PostgreSQL."""

from __future__ import annotations

import datetime as dt
import json
import pathlib

import pytest

from deltabench.cli.app import main

UTC = dt.timezone.utc


def _cli(capsys, *argv: str) -> tuple[int, str, str]:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as exit_info:
        main(list(argv))
    out, err = capsys.readouterr()
    return exit_info.value.code, out, err


def test_runs_list(db_url, factory, tmp_path: pathlib.Path, capsys) -> None:  # type: ignore[no-untyped-def]
    old = factory.document(created_at=dt.datetime(2026, 1, 1, 12, tzinfo=UTC), commit="b" * 40)
    new = factory.document(created_at=dt.datetime(2026, 2, 1, 8, 30, tzinfo=UTC), machine_kind="cpu")
    new.meta["complete"] = False
    new.jobs = new.jobs[:3]
    for doc in (old, new):
        (tmp_path / f"{doc.run_id}.json").write_text(doc.to_json())
        assert _cli(capsys, "ingest", str(tmp_path / f"{doc.run_id}.json"), "--db", db_url)[0] == 0

    rc, out, err = _cli(capsys, "runs", "list", "--db", db_url, "--format", "json")
    assert rc == 0, err
    assert json.loads(out) == [
        {
            "id": new.run_id,
            "suite": "train",
            "commit": "a" * 40,
            "machine": "cpu",
            "jobs": 3,
            "complete": False,
            "created": "2026-02-01T08:30:00+00:00",
        },
        {
            "id": old.run_id,
            "suite": "train",
            "commit": "b" * 40,
            "machine": "h200",
            "jobs": 4,
            "complete": True,
            "created": "2026-01-01T12:00:00+00:00",
        },
    ]

    rc, out, err = _cli(capsys, "runs", "list", "--db", db_url)
    assert rc == 0, err
    header, *rows = [line.split() for line in out.splitlines()]
    assert header == ["id", "suite", "commit", "machine", "jobs", "complete", "created"]
    assert rows == [
        [new.run_id, "train", "a" * 12, "cpu", "3", "no", "2026-02-01T08:30:00+00:00"],
        [old.run_id, "train", "b" * 12, "h200", "4", "yes", "2026-01-01T12:00:00+00:00"],
    ]


def test_runs_list_bad_input(db_url, tmp_path: pathlib.Path, capsys) -> None:  # type: ignore[no-untyped-def]
    rc, out, err = _cli(capsys, "runs", "list", "--db", db_url, "--format", "yaml")
    assert (rc, out) == (2, "") and err.strip() == "deltabench: error: unknown format 'yaml': use one of table, json"
    rc, _out, err = _cli(capsys, "runs", "list", "--db", str(tmp_path / "missing.db"))
    assert rc == 2 and len(err.strip().splitlines()) == 1  # a read never creates a store
    assert not (tmp_path / "missing.db").exists()
