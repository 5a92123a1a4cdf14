"""What the API lets in and how it reads back what older versions let in, on SQLite and PostgreSQL.

Each test reproduces a defect of the store as it was: documents with impossible timings, statuses, ops, versions,
times and ids were accepted (201); a bogus token with a malformed or non-UTF-8 body got the body's validation
errors echoed back (or a 500); one stored Infinity or NaN made history, regressions and comparisons answer 500;
and no run could be deleted.
"""

from __future__ import annotations

import datetime as dt
import json
import math

import pytest

from deltabench.db.engine import get_engine, session_scope
from deltabench.db.ingest import ingest_document

UTC = dt.timezone.utc


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _count_runs(client) -> int:  # type: ignore[no-untyped-def]
    return client.get("/api/v1/runs").json()["count"]


def _bad_documents(build) -> dict[str, tuple[dict, str, str]]:  # type: ignore[no-untyped-def]
    """name -> (a document as JSON that must be refused, a field its 422 names, words of the rule)."""
    good = build.document().model_dump(mode="json")

    def variant(change) -> dict:  # type: ignore[no-untyped-def]
        doc = json.loads(json.dumps(good))
        change(doc)
        return doc

    def timing(**fields):  # type: ignore[no-untyped-def]
        return lambda d: d["jobs"][0]["timing"].update(fields)

    return {
        "median Infinity": (variant(timing(median_ms=math.inf)), "timing", "finite"),
        "median 1e400": (variant(timing(median_ms=1e400)), "timing", "finite"),
        "NaN sample": (variant(timing(samples_ms=[1.0, math.nan])), "timing", "finite"),
        "negative sample": (variant(timing(samples_ms=[1.0, -1.0])), "timing", "positive"),
        "empty samples on ok": (variant(timing(samples_ms=[])), "jobs", "samples"),
        "ok without timing": (variant(lambda d: d["jobs"][0].update(timing=None)), "jobs", "needs a timing"),
        "failed with timing": (variant(lambda d: d["jobs"][0].update(status="failed")), "jobs", "no timing"),
        "unknown op": (variant(lambda d: d["jobs"][0]["case"].update(op="nope")), "op", "unknown op"),
        "empty op": (variant(lambda d: d["jobs"][0]["case"].update(op="")), "op", "unknown op"),
        "schema 999": (variant(lambda d: d.update(schema_version=999)), "schema_version", "less than or equal"),
        "year 9999": (variant(lambda d: d.update(created_at="9999-01-01T00:00:00Z")), "created_at", "future"),
        "year 0001": (variant(lambda d: d.update(created_at="0001-01-01T00:00:00Z")), "created_at", "before 2020"),
        "empty run id": (variant(lambda d: d.update(run_id="")), "run_id", "not a valid id"),
        "blank run id": (variant(lambda d: d.update(run_id=" ")), "run_id", "not a valid id"),
        "slash run id": (variant(lambda d: d.update(run_id="a/b")), "run_id", "not a valid id"),
        "run id latest": (variant(lambda d: d.update(run_id="latest")), "run_id", "reserved"),
        "10,000-character run id": (variant(lambda d: d.update(run_id="r" * 10_000)), "run_id", "not a valid id"),
        "slash job id": (variant(lambda d: d["jobs"][0].update(job_id="x/y")), "job_id", "not a valid id"),
    }


def test_refused_documents_get_422_naming_field_and_rule_and_store_nothing(app_client, db_url, build) -> None:  # type: ignore[no-untyped-def]
    client = app_client()
    token = build.token(db_url)
    good = build.document().model_dump(mode="json")
    for name, (doc, field, rule) in _bad_documents(build).items():
        # A good document beside the bad one: the batch is refused whole, nothing half-stored.
        body = json.dumps({"documents": [good, doc]}, allow_nan=True)
        r = client.post("/api/v1/runs", content=body, headers={**_auth(token), "content-type": "application/json"})
        assert r.status_code == 422, (name, r.status_code, r.text[:300])
        first = r.json()["detail"][0]
        assert field in [str(p) for p in first["loc"]], (name, first)
        assert rule in first["msg"], (name, first)
        assert len(r.content) < 4000, (name, len(r.content))
        assert _count_runs(client) == 0, name
    assert (
        client.post("/api/v1/runs", content=json.dumps({"documents": [good]}), headers=_auth(token)).status_code == 201
    )


def test_values_a_database_cannot_hold_are_refused_with_their_path(app_client, db_url, build) -> None:  # type: ignore[no-untyped-def]
    client = app_client()
    token = build.token(db_url)
    good = build.document().model_dump(mode="json")
    cases = {
        "documents[1].meta.big: integer 1180591620717411303424 does not fit in 64 bits": {"big": 2**70},
        "documents[1].meta.tags[2]: text may not contain NUL characters": {"tags": [1.5, "a", "b\x00"]},
        "documents[1].meta.nested.deep[0].k: integer -9223372036854775809": {"nested": {"deep": [{"k": -(2**63) - 1}]}},
    }
    for message, meta in cases.items():
        bad = {**json.loads(json.dumps(good)), "run_id": f"bad-{len(message)}", "meta": meta}
        body = json.dumps({"documents": [good, bad]})
        r = client.post("/api/v1/runs", content=body, headers={**_auth(token), "content-type": "application/json"})
        assert r.status_code == 422 and message in r.text, (message, r.text[:300])
        assert _count_runs(client) == 0


def test_the_fast_screen_passes_every_unstorable_value_to_the_full_check(build) -> None:  # type: ignore[no-untyped-def]
    """The ingest walks the parsed documents for unstorable values only when their JSON text may hold one: the
    screen must never miss one (the API test above), and should pass ordinary documents (a sixth of the time)."""
    from deltabench.web.crud import may_hold_unstorable

    for value in (2**63, -(2**63) - 1, 2**70, "b\x00", "a\udc80b", "\ud800", 1e30, [0, 12345678901234567890]):
        text = json.dumps({"documents": [{"meta": {"v": value}}]}).encode()
        assert may_hold_unstorable(text), value
    ordinary = build.document(jobs=[build.job(median=0.0009876543210987654), build.job(median=1.5e15)])
    text = ordinary.model_dump_json().encode()
    assert b"e-" in text or b"0.000987" in text
    assert not may_hold_unstorable(text)
    assert not may_hold_unstorable(json.dumps({"run_id": "1e27ab", "x": 10**18 - 1, "y": "é"}).encode())


def test_writes_authenticate_before_reading_the_body(app_client, db_url, build) -> None:  # type: ignore[no-untyped-def]
    client = app_client(max_body_bytes=32 * 2**20)
    token = build.token(db_url)
    json_type = {"content-type": "application/json"}
    bogus = {**_auth("dbt_bogus"), **json_type}
    big = b'{"documents": [' + b"x" * (20 * 2**20)  # 20 MiB, malformed
    for body in (b"{not json", big, b"\xff\xfe\x00garbage"):
        assert client.post("/api/v1/runs", content=body, headers=json_type).status_code == 401
        r = client.post("/api/v1/runs", content=body, headers=bogus)
        assert r.status_code == 403 and len(r.content) < 200, (r.status_code, r.text[:200])
        r = client.post("/api/v1/jobs", content=body, headers=bogus)
        assert r.status_code == 403, r.text[:200]
    # With a live token the body is read: a 422 that quotes a short excerpt at most, never the body.
    for body in (big, b"\xff\xfe\x00garbage", b'{"documents": "' + b"y" * 100_000 + b'"}'):
        r = client.post("/api/v1/runs", content=body, headers={**_auth(token), **json_type})
        assert r.status_code == 422 and len(r.content) < 2000, (r.status_code, len(r.content))
    r = client.post("/api/v1/jobs", content=b"\xff\xfe{", headers={**_auth(token), **json_type})
    assert 400 <= r.status_code < 500 and len(r.content) < 2000


def _store_as_an_older_version(db_url: str, doc) -> None:  # type: ignore[no-untyped-def]
    """Store `doc` as versions before the document validated its timings did (ingest itself does not check)."""
    with session_scope(get_engine(db_url)) as session:
        ingest_document(session, doc)


def test_bad_points_stored_by_older_versions_are_skipped_with_a_note(app_client, db_url, build) -> None:  # type: ignore[no-untyped-def]
    client = app_client()
    start = dt.datetime.now(UTC) - dt.timedelta(days=30)
    docs = []
    for i in range(12):
        median = 1.0 if i < 6 else 1.3
        doc = build.document(
            created_at=start + dt.timedelta(days=i), commit=f"{i:040x}", jobs=[build.job(median=median)]
        )
        docs.append(doc)
    # Then the newest run holds an Infinity median and the one before a NaN sample (model fields are assigned
    # without validation, as a version that did not check would have stored them).
    docs[-1].jobs[0].timing.median_ms = math.inf
    docs[-2].jobs[0].timing.samples_ms = [1.3, math.nan, 1.31]
    docs[-3].jobs[0].timing.median_ms = 1e400
    for doc in docs:
        _store_as_an_older_version(db_url, doc)
    params = {"op": "gdn", "impl": "torch_chunk", "shape": "B2-T1024-H4-K64-V64", "dtype": "bf16", "mode": "fwd"}
    r = client.get("/api/v1/history", params={**params, "machine": "cpu"})
    assert r.status_code == 200, r.text[:300]
    assert r.json()["skipped_points"] >= 2 and len(r.json()["points"]) <= 10
    assert build.refreshed(client)["skipped_points"] >= 2
    for page in ("/regressions", f"/runs/{docs[-1].run_id}", f"/compare?base={docs[0].run_id}&head={docs[-2].run_id}"):
        r = client.get(page, headers={"accept": "text/html"})
        assert r.status_code == 200, (page, r.status_code, r.text[:300])
        assert "skipped" in r.text, page
    r = client.get("/api/v1/compare/runs", params={"base": docs[0].run_id, "head": docs[-2].run_id})
    assert r.status_code == 200, r.text[:300]
    assert r.json()["skipped_points"] == 1
    r = client.get(f"/api/v1/runs/{docs[-1].run_id}")
    assert r.status_code == 200, r.text[:300]
    assert r.json()["jobs"][0]["timing"] is None and "skipped" in r.json()["jobs"][0]["notes"]


def test_delete_a_run(app_client, db_url, build) -> None:  # type: ignore[no-untyped-def]
    client = app_client()
    token = build.token(db_url)
    keep, mistake = build.document(), build.document()
    assert client.post("/api/v1/runs", json=build.body(keep, mistake), headers=_auth(token)).status_code == 201
    url = f"/api/v1/runs/{mistake.run_id}"
    assert client.delete(url).status_code == 401
    assert client.delete(url, headers=_auth("dbt_bogus")).status_code == 403
    assert client.delete("/api/v1/runs/nope", headers=_auth(token)).status_code == 404
    assert client.delete(f"/api/v1/runs/{mistake.run_id[:8]}", headers=_auth(token)).status_code == 404  # no prefix
    r = client.delete(url, headers=_auth(token))
    assert r.status_code == 200 and r.json()["detail"] == f"deleted run {mistake.run_id} (3 results)"
    assert client.get(url).status_code == 404
    assert [run["run_id"] for run in client.get("/api/v1/runs").json()["data"]] == [keep.run_id]
    assert client.get(f"/api/v1/results?run={keep.run_id}").json()["count"] == 3
    # The same document may be stored again afterwards (a mistake corrected).
    assert client.post("/api/v1/runs", json=build.body(mistake), headers=_auth(token)).status_code == 201
    assert client.get(url).status_code == 200


@pytest.mark.parametrize("complete", [False, True])
def test_runs_cut_short_are_marked_incomplete(app_client, db_url, build, complete: bool) -> None:  # type: ignore[no-untyped-def]
    client = app_client()
    token = build.token(db_url)
    doc = build.document(meta={"complete": complete})
    assert client.post("/api/v1/runs", json=build.body(doc), headers=_auth(token)).status_code == 201
    listed = client.get("/api/v1/runs").json()["data"][0]
    assert listed["complete"] is complete
    for page in ("/", f"/runs/{doc.run_id}"):
        text = client.get(page, headers={"accept": "text/html"}).text
        assert ("incomplete" in text) is (not complete), page


def test_the_fast_screen_answers_as_its_regular_expression_does() -> None:
    """The screen is written as byte searches for speed; it must say what this regular expression (its definition:
    a NUL or surrogate in the text, a number of 19 integer digits or an exponent of 19 or more) says, on random
    texts built from the characters that matter."""
    import random
    import re

    from deltabench.web.crud import may_hold_unstorable

    definition = re.compile(
        rb"\\u0000|\x00|\\u[dD][89abcdefABCDEF]|\xed[\xa0-\xbf]"
        rb"|[:,\[]\s*-?[0-9]{19}|[:,\[]\s*-?[0-9]+(?:\.[0-9]*)?[eE]\+?(?:19|[2-9][0-9]|[0-9]{3})"
    )
    pieces = [b"0", b"1", b"9", b".", b"e", b"E", b"+", b"-", b" ", b"\n", b":", b",", b"[", b"a", b'"', b"\\u"]
    pieces += [b"d8", b"\xed", b"\xa5", b"\x00", b"0000", b"1234567890", b"19", b"25", b"\\"]
    rng = random.Random(0)
    for _ in range(50_000):
        text = b"".join(rng.choice(pieces) for _ in range(rng.randint(1, 30)))
        assert may_hold_unstorable(text) == bool(definition.search(text)), text
    assert may_hold_unstorable(b'{"a": [1, 2,\n -1234567890123456789]}')
    assert may_hold_unstorable(b'{"a": 1.E19}') and may_hold_unstorable(b'{"a": 12e+019}')
    assert not may_hold_unstorable(b'{"a": 0.12345678901234567890, "b": ".5e19", "c": "1e27ab", "d": 1e18}')
