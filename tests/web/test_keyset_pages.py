"""Keyset pagination of every list: runs, results, jobs and annotations (``before`` = the previous page's
``next_before``), series (``after`` = ``next_after``). Pages meet exactly at their boundaries (nothing repeated,
nothing skipped, ties in time broken by id), the last page says so, and the pages together are the whole list in
order. SQLite and PostgreSQL."""

from __future__ import annotations

import datetime as dt

import pytest

UTC = dt.timezone.utc


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _store(client, db_url, build, n_runs: int) -> None:  # type: ignore[no-untyped-def]
    start = dt.datetime.now(UTC) - dt.timedelta(days=10)
    # Stored out of time order (ids do not follow time), and runs 2 and 3 share a creation time: the page order
    # falls back on the id there.
    times = [start + dt.timedelta(hours=h) for h in (4, 0, 2, 2, 1, 5, 3)[:n_runs]]

    def jobs():  # type: ignore[no-untyped-def]
        return [build.job(impl="torch_chunk"), build.job(impl="fla_chunk")]

    docs = [build.document(created_at=t, commit=f"{i:040x}", jobs=jobs()) for i, t in enumerate(times)]
    r = client.post("/api/v1/runs", json=build.body(*docs), headers=_auth(build.token(db_url)))
    assert r.status_code == 201, r.text


def _pages(client, path: str, key: str, limit: int, cursor: str = "before") -> list[list]:  # type: ignore[no-untyped-def]
    pages, before = [], None
    while True:
        params = {"limit": limit, **({cursor: before} if before is not None else {})}
        body = client.get(path, params=params).json()
        pages.append([row[key] for row in body["data"]])
        before = body[f"next_{cursor}"]
        if before is None:
            return pages
        assert before == body["data"][-1][key]


@pytest.mark.parametrize(("n_runs", "sizes"), [(7, [3, 3, 1]), (6, [3, 3, 0])])
def test_runs_pages_meet_at_their_boundaries(app_client, db_url, build, n_runs: int, sizes: list[int]) -> None:
    client = app_client()
    _store(client, db_url, build, n_runs)
    whole = [r["run_id"] for r in client.get("/api/v1/runs", params={"limit": 100}).json()["data"]]
    assert len(whole) == n_runs
    pages = _pages(client, "/api/v1/runs", "run_id", 3)
    # A list of a whole number of pages ends with an empty page: the last full one cannot know it is last.
    assert [len(p) for p in pages] == sizes
    assert [r for p in pages for r in p] == whole
    assert client.get("/api/v1/runs", params={"before": "no-such-run"}).json()["data"] == []


def test_results_pages_meet_at_their_boundaries(app_client, db_url, build) -> None:
    client = app_client()
    _store(client, db_url, build, 5)  # 10 results, two per run: every page boundary of 4 splits or ends a run
    whole = [r["id"] for r in client.get("/api/v1/results", params={"limit": 100}).json()["data"]]
    assert len(whole) == 10
    pages = _pages(client, "/api/v1/results", "id", 4)
    assert [len(p) for p in pages] == [4, 4, 2]
    assert [r for p in pages for r in p] == whole
    assert client.get("/api/v1/results", params={"before": 10**9}).json()["data"] == []


def test_jobs_annotations_and_series_pages_meet_at_their_boundaries(app_client, db_url, build) -> None:  # type: ignore[no-untyped-def]
    client = app_client()
    token = build.token(db_url)
    for kind in ("h200", "a100", "h200", "cpu", "h200"):
        spec = {"ops": ["gdn"], "shapes": ["B=1,T=64,H=2,K=16,V=16"], "device_kind": kind}
        assert client.post("/api/v1/jobs", json=spec, headers=_auth(token)).status_code == 201
    whole = [j["id"] for j in client.get("/api/v1/jobs", params={"limit": 100}).json()["data"]]
    assert len(whole) == 5
    pages = _pages(client, "/api/v1/jobs", "id", 2)
    assert [len(p) for p in pages] == [2, 2, 1] and [j for p in pages for j in p] == whole
    assert client.get("/api/v1/jobs", params={"before": 10**9}).json()["data"] == []
    deep = client.get("/api/v1/jobs", params={"before": whole[1], "device_kind": "h200"}).json()
    assert [j["device_kind"] for j in deep["data"]] == ["h200"] * len(deep["data"]) and deep["count"] == 3

    _store(client, db_url, build, 3)  # two series (torch_chunk, fla_chunk) on one machine class
    series = [s["key"] for s in client.get("/api/v1/series", params={"limit": 100}).json()["data"]]
    assert len(series) == 2
    pages = _pages(client, "/api/v1/series", "key", 1, cursor="after")
    assert [len(p) for p in pages] == [1, 1, 0] and [k for p in pages for k in p] == series
    assert client.get("/api/v1/series", params={"after": "no/such/series"}).json()["data"] == []
    for i in range(3):
        note = {"series_key": series[i % 2], "kind": "acknowledged", "note": f"note {i}"}
        assert client.post("/api/v1/annotations", json=note, headers=_auth(token)).status_code == 201
    whole = [a["id"] for a in client.get("/api/v1/annotations").json()["data"]]
    assert len(whole) == 3
    pages = _pages(client, "/api/v1/annotations", "id", 2)
    assert [len(p) for p in pages] == [2, 1] and [a for p in pages for a in p] == whole
