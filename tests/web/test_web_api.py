"""The JSON API on a real database (SQLite and PostgreSQL): ingest, reads, comparisons, history, jobs, access."""

from __future__ import annotations

import datetime as dt

UTC = dt.timezone.utc


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_ingest_needs_a_live_token_and_is_idempotent(app_client, db_url, build) -> None:
    client = app_client()
    doc = build.document()
    body = build.body(doc)
    assert client.post("/api/v1/runs", json=body).status_code == 401
    assert client.post("/api/v1/runs", json=body, headers=_auth("dbt_not-a-real-token")).status_code == 403
    token = build.token(db_url, "ci")
    first = client.post("/api/v1/runs", json=body, headers=_auth(token))
    assert first.status_code == 201, first.text
    assert first.json() == {"runs": [doc.run_id], "jobs": 3, "new_jobs": 3, "already_stored_jobs": 0}
    again = client.post("/api/v1/runs", json=body, headers=_auth(token))
    assert again.status_code == 201
    # The answer says the second upload stored nothing new.
    assert again.json() == {"runs": [doc.run_id], "jobs": 3, "new_jobs": 0, "already_stored_jobs": 3}
    stored = client.get(f"/api/v1/runs/{doc.run_id}").json()
    assert len(stored["jobs"]) == 3, "a re-upload must not store a job twice"
    listing = client.get("/api/v1/runs").json()
    assert listing["count"] == 1
    assert listing["data"][0]["status_counts"] == {"ok": 2, "incorrect": 1}
    # A revoked token no longer writes.
    from deltabench.db.engine import get_engine, session_scope
    from deltabench.web.security.tokens import revoke_token

    with session_scope(get_engine(db_url)) as session:
        revoke_token(session, name="ci")
    assert client.post("/api/v1/runs", json=body, headers=_auth(token)).status_code == 403


def test_results_filters(app_client, db_url, build) -> None:
    client = app_client()
    token = build.token(db_url)
    t0 = dt.datetime(2026, 3, 1, tzinfo=UTC)
    docs = [
        build.document(created_at=t0, commit="1" * 40),
        build.document(created_at=t0 + dt.timedelta(days=1), commit="2" * 40, machine_kind="h200"),
        build.document(created_at=t0 + dt.timedelta(days=2), commit="3" * 40),
    ]
    assert client.post("/api/v1/runs", json=build.body(*docs), headers=_auth(token)).status_code == 201

    def get(**params: object) -> list[dict]:
        r = client.get("/api/v1/results", params=params)
        assert r.status_code == 200, r.text
        return r.json()["data"]

    assert len(get()) == 9
    assert {r["impl"] for r in get(impl="triton_chunk")} == {"triton_chunk"}
    assert len(get(impl=["triton_chunk", "torch_chunk"], shape="T=4096")) == 3
    assert len(get(shape="B2-T1024-H4-K64-V64", dtype="bf16", mode="fwd", op="gdn")) == 6
    assert {r["machine_kind"] for r in get(machine="h200")} == {"h200"}
    in_range = get(commit_from="2222", commit_to="3333")
    assert {r["git_commit"][0] for r in in_range} == {"2", "3"}
    assert get(status="incorrect")[0]["reason"].startswith("grad:q")
    assert {r["run_id"] for r in get()} == {d.run_id for d in docs}
    assert client.get("/api/v1/results", params={"shape": "Z=3"}).status_code == 422
    assert client.get("/api/v1/results", params={"commit_from": "2222"}).status_code == 422
    assert client.get("/api/v1/results", params={"commit_from": "ffff", "commit_to": "3333"}).status_code == 422
    assert client.get("/api/v1/results", params={"op": "gdn\x00"}).status_code == 422
    assert client.get("/api/v1/results", params={"limit": 10**30}).status_code == 422


def test_comparisons_grade_a_slower_head(app_client, db_url, build) -> None:
    client = app_client()
    token = build.token(db_url)
    base = build.document(jobs=[build.job(impl="torch_chunk", median=1.0), build.job(impl="triton_chunk", median=0.5)])
    head = build.document(
        # One CPU run each, no history: only a change beyond the CPU's measured run-to-run spread counts (~13x).
        jobs=[build.job(impl="torch_chunk", median=20.0), build.job(impl="triton_chunk", median=0.5, spread=0.012)]
    )
    client.post("/api/v1/runs", json=build.body(base, head), headers=_auth(token))
    r = client.get("/api/v1/compare/runs", params={"base": base.run_id, "head": head.run_id[:10]})
    assert r.status_code == 200, r.text
    by_impl = {row["impl"]: row for row in r.json()["rows"]}
    assert by_impl["torch_chunk"]["outcome"] == "regression"
    assert by_impl["torch_chunk"]["stats"]["ci_low"] > 1.0
    assert by_impl["triton_chunk"]["outcome"] == "within_noise"
    assert r.json()["failed"] is True
    # Verdicts and power: the blind CPU row could not have seen a 5% change, and says how much it could have missed.
    assert by_impl["torch_chunk"]["verdict"] == "different" and by_impl["triton_chunk"]["verdict"] == "unknown"
    assert by_impl["triton_chunk"]["stats"]["min_detectable_change"] > 10.0
    assert r.json()["verdict"] == "different" and r.json()["verdicts"] == {"same": 0, "different": 1, "unknown": 1}
    impls = client.get(
        "/api/v1/compare/impls", params={"run": base.run_id, "base_impl": "torch_chunk", "head_impl": "triton_chunk"}
    ).json()
    # 2x faster within one run: the two impls share its machine state, so the run's own samples judge them (their
    # interval excludes 1), not the CPU's cross-run spread, which would call a 2x speedup "within noise".
    row = impls["rows"][0]
    assert row["outcome"] == "improvement", row
    assert "vs the base impl in the same run" in row["reason"] and row["stats"]["spread_source"] == "same run"
    assert abs(row["stats"]["ratio"] - 0.5) < 0.01 and row["stats"]["ci_high"] < 1.0
    # The same run's two impls at equal speed stay within noise.
    same = client.get(
        "/api/v1/compare/impls", params={"run": head.run_id, "base_impl": "triton_chunk", "head_impl": "triton_chunk"}
    ).json()
    assert same["rows"][0]["outcome"] == "within_noise", same["rows"][0]
    # One run's own samples see a 5% change between two of its impls: the same, with its minimum detectable change.
    assert same["rows"][0]["verdict"] == "same" and same["rows"][0]["stats"]["min_detectable_change"] <= 0.05
    assert same["verdict"] == "same"
    assert client.get("/api/v1/compare/runs", params={"base": "nope", "head": head.run_id}).status_code == 404
    itself = client.get("/api/v1/compare/runs", params={"base": head.run_id, "head": head.run_id[:10]})
    assert itself.status_code == 422 and "are the same run" in itself.text, itself.text
    # The page's outcome badges count what occurred: no red "0 correctness failures".
    page = client.get("/compare", params={"base": base.run_id, "head": head.run_id}).text
    assert "1 regression</span>" in page and "0 correctness failure" not in page and ">0 " not in page
    assert '<strong class="verdict">DIFFERENT</strong>' in page and "1 unknown</span>" in page
    assert "<th>min detectable</th>" in page and "could go unseen" in page
    bad_alpha = {"base": base.run_id, "head": head.run_id, "alpha": 2}
    assert client.get("/api/v1/compare/runs", params=bad_alpha).status_code == 422


def test_history_finds_the_step_and_regressions_list_it(app_client, db_url, build) -> None:
    client = app_client()
    token = build.token(db_url)
    start = dt.datetime.now(UTC) - dt.timedelta(days=40)
    docs = []
    for i in range(30):
        median = (1.0 if i < 18 else 1.15) * (1 + 0.004 * ((i * 5) % 3 - 1))
        docs.append(
            build.document(
                created_at=start + dt.timedelta(days=i),
                commit=f"{i:040x}",
                jobs=[build.job(impl="torch_chunk", median=median), build.job(impl="triton_chunk", median=0.5)],
            )
        )
    client.post("/api/v1/runs", json=build.body(*docs), headers=_auth(token))
    params = {
        "op": "gdn",
        "impl": "torch_chunk",
        "shape": "B2-T1024-H4-K64-V64",
        "dtype": "bf16",
        "mode": "fwd",
        "machine": "cpu",
    }
    r = client.get("/api/v1/history", params=params)
    assert r.status_code == 200, r.text
    h = r.json()
    assert len(h["points"]) == 30
    assert [p["run_id"] for p in h["points"]] == [d.run_id for d in docs], "oldest first"
    assert [cp["index"] for cp in h["change_points"]] == [18]
    assert h["change_points"][0]["run_id"] == docs[18].run_id
    assert 1.1 < h["change_points"][0]["ratio"] < 1.2
    assert client.get("/api/v1/history", params={**params, "impl": "nope"}).status_code == 404
    assert client.get("/api/v1/history", params={**params, "shape": "B2-T1024"}).status_code == 422

    build.refreshed(client)
    regs = client.get("/api/v1/regressions", params={"only_regressions": True}).json()
    assert regs["series_scanned"] == 2
    assert [r["impl"] for r in regs["data"]] == ["torch_chunk"]
    # The alert names the benchmark, shape, measure, effect and the runs the step lies between; confirmed by the
    # 11 runs after it.
    alert = regs["data"][0]
    assert alert["change_point"]["confirmed"] is True and alert["change_point"]["n_after"] == 12
    assert alert["measure"] == "median_ms" and 0.1 < alert["effect"] < 0.2
    assert alert["change_point"]["before_run_id"] == docs[17].run_id
    assert alert["alert"].startswith("gdn/torch_chunk B2-T1024-H4-K64-V64 bf16 fwd on cpu: median time +1")
    assert alert["change_point"]["before_commit"] == f"{17:040x}" and alert["alert"].endswith("(confirmed)")
    key = regs["data"][0]["series_key"]
    note = {"series_key": key, "kind": "expected", "note": "new masking", "run_id": docs[18].run_id}
    assert client.post("/api/v1/annotations", json=note).status_code == 401
    made = client.post("/api/v1/annotations", json=note, headers=_auth(token))
    assert made.status_code == 201, made.text
    assert client.post("/api/v1/annotations", json={**note, "kind": "nah"}, headers=_auth(token)).status_code == 422
    regs = client.get("/api/v1/regressions").json()
    assert regs["data"][0]["annotation"]["note"] == "new masking"
    assert client.get("/api/v1/annotations", params={"series_key": key}).json()["count"] == 1
    assert client.get("/api/v1/history", params=params).json()["annotations"][0]["kind"] == "expected"
    page = client.get("/regressions", params={"only_regressions": True}).text
    assert "1 change point found in the 2 series active in the last" in page, page[:2000]


def test_a_step_on_the_newest_run_alone_is_not_a_regression_until_a_later_run_confirms_it(
    app_client, db_url, build
) -> None:
    client = app_client()
    token = build.token(db_url)
    start = dt.datetime.now(UTC) - dt.timedelta(days=30)

    def doc(i: int, median: float):  # type: ignore[no-untyped-def]
        when = start + dt.timedelta(days=i)
        return build.document(created_at=when, commit=f"{i:040x}", jobs=[build.job(impl="torch_chunk", median=median)])

    flat = [doc(i, 1 + 0.004 * ((i * 5) % 3 - 1)) for i in range(25)]
    client.post("/api/v1/runs", json=build.body(*flat, doc(25, 1.4)), headers=_auth(token))
    found = build.refreshed(client)["data"]
    assert len(found) == 1 and found[0]["change_point"]["confirmed"] is False, found
    assert found[0]["alert"].endswith("(unconfirmed: one run so far)")
    assert client.get("/api/v1/regressions", params={"only_regressions": True}).json()["data"] == []
    client.post("/api/v1/runs", json=build.body(doc(26, 1.4)), headers=_auth(token))
    build.refreshed(client)
    (alert,) = client.get("/api/v1/regressions", params={"only_regressions": True}).json()["data"]
    assert alert["change_point"]["confirmed"] is True and alert["change_point"]["n_after"] == 2


def test_history_and_series_follow_the_harness_series_definition(app_client, db_url, build) -> None:
    """A torch major.minor upgrade starts a new series (harness/series.py); the history never mixes the two."""
    client = app_client()
    token = build.token(db_url)
    start = dt.datetime.now(UTC) - dt.timedelta(days=10)
    docs = []
    for i in range(6):
        doc = build.document(
            created_at=start + dt.timedelta(days=i),
            commit=f"{i:040x}",
            jobs=[build.job(impl="torch_chunk", median=1.0 if i < 3 else 3.0)],
        )
        torch = "2.13.2" if i < 3 else "2.14.0"
        docs.append(doc.model_copy(update={"environment": doc.environment.model_copy(update={"torch": torch})}))
    assert client.post("/api/v1/runs", json=build.body(*docs), headers=_auth(token)).status_code == 201
    old, new = "python=3.11,torch=2.13", "python=3.11,torch=2.14"

    listed = client.get("/api/v1/series", params={"op": "gdn"}).json()["data"]
    assert [(s["software"], s["key"]) for s in listed] == [
        (old, f"gdn/torch_chunk/B2-T1024-H4-K64-V64/bf16/fwd@cpu[{old}]"),
        (new, f"gdn/torch_chunk/B2-T1024-H4-K64-V64/bf16/fwd@cpu[{new}]"),
    ]
    params = {"op": "gdn", "impl": "torch_chunk", "shape": "B2-T1024-H4-K64-V64", "dtype": "bf16", "mode": "fwd"}
    params["machine"] = "cpu"
    latest = client.get("/api/v1/history", params=params).json()  # no software: the series it is in now
    assert latest["software"] == new and [p["run_id"] for p in latest["points"]] == [d.run_id for d in docs[3:]]
    assert latest["change_points"] == [], "the 3x jump is a software change, not a change point"
    before = client.get("/api/v1/history", params={**params, "software": "torch=2.13, python=3.11"}).json()
    assert before["series_key"] == listed[0]["key"]
    assert [p["median_ms"] for p in before["points"]] == [1.0, 1.0, 1.0]
    assert client.get("/api/v1/history", params={**params, "software": "torch=2.99"}).status_code == 404
    assert client.get("/api/v1/history", params={**params, "software": "torch"}).status_code == 422
    page = client.get("/history", params={**params, "software": old})
    assert page.status_code == 200 and "torch=2.13" in page.text


def test_a_cpu_job_beyond_host_memory_is_refused_at_submission(app_client, db_url, build) -> None:  # type: ignore[no-untyped-def]
    """As `deltabench run` refuses it before its first job: 422 with the estimate, nothing queued. A GPU kind's
    hosts are not this one: the same shape for them is queued."""
    client = app_client()
    token = build.token(db_url, "alice")
    huge = {"ops": ["gdn"], "shapes": ["B=64,T=65536,H=32,K=128"], "modes": ["fwd+bwd"], "device_kind": "cpu"}
    refused = client.post("/api/v1/jobs", json=huge, headers=_auth(token))
    assert refused.status_code == 422, refused.text
    assert "of host memory" in refused.text and "use a smaller shape" in refused.text, refused.text
    assert client.get("/api/v1/jobs").json()["count"] == 0
    assert client.post("/api/v1/jobs", json={**huge, "device_kind": "h200"}, headers=_auth(token)).status_code == 201


def test_jobs_submit_list_status_cancel(app_client, db_url, build) -> None:
    client = app_client()
    token = build.token(db_url, "alice")
    spec = {"ops": ["gdn"], "impls": ["torch_chunk"], "shapes": ["B=1,T=64,H=2,K=16"], "device_kind": "cpu"}
    assert client.post("/api/v1/jobs", json=spec).status_code == 401
    r = client.post("/api/v1/jobs", json=spec, headers=_auth(token))
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["submitted_by"] == "alice"
    assert job["spec"]["shapes"] == ["B=1,T=64,H=2,K=16,V=16"]
    for bad in (
        {"ops": ["nope"], "shapes": ["B=1,T=64,H=2,K=16"]},
        {"ops": ["gdn"]},
        {"ops": ["gdn"], "shapes": ["B=1"]},
        {"suite": "smoke", "impls": ["nope"]},
        {"suite": "no-such-suite"},
        {"suite": "smoke", "device_kind": "H 200"},
        {"suite": "smoke", "extra": 1},
    ):
        assert client.post("/api/v1/jobs", json=bad, headers=_auth(token)).status_code == 422, bad
    job_id = job["id"]
    # A worker reports progress, then posts its run: the run names the job, which is then done.
    report = {"status": "running", "worker": "w1"}
    running = client.post(f"/api/v1/jobs/{job_id}/status", json=report, headers=_auth(token))
    assert running.json()["status"] == "running" and running.json()["attempts"] == 1
    doc = build.document(meta={"queue_job_id": job_id, "worker": "w1"})
    client.post("/api/v1/runs", json=build.body(doc), headers=_auth(token))
    done = client.get(f"/api/v1/jobs/{job_id}").json()
    assert (done["status"], done["run_id"]) == ("done", doc.run_id)
    workers = client.get("/api/v1/workers").json()["data"]
    assert workers[0]["name"] == "w1" and workers[0]["jobs_done"] == 1
    other = client.post("/api/v1/jobs", json={"suite": "smoke", "ops": ["kda"]}, headers=_auth(token)).json()
    listing = client.get("/api/v1/jobs", params={"status": "queued"}).json()
    assert [j["id"] for j in listing["data"]] == [other["id"]]
    assert client.post(f"/api/v1/jobs/{other['id']}/cancel").status_code == 401
    assert client.post(f"/api/v1/jobs/{other['id']}/cancel", headers=_auth(token)).json()["status"] == "cancelled"
    assert client.post(f"/api/v1/jobs/{job_id}/cancel", headers=_auth(token)).json()["status"] == "done"
    assert client.get("/api/v1/jobs/999999").status_code == 404
    assert client.get("/api/v1/jobs/0").status_code == 422
    assert client.get("/api/v1/machines").json()["data"][0]["machine_kind"] == "cpu"


def test_bad_bodies_get_413_and_422_never_500(app_client, db_url, build) -> None:
    client = app_client(max_body_bytes=4096)
    token = build.token(db_url)
    big = build.body(build.document(jobs=[build.job(n=400)]))
    r = client.post("/api/v1/runs", json=big, headers=_auth(token))
    assert r.status_code == 413 and "limit" in r.json()["detail"]

    def chunks():  # no Content-Length: counted as it streams
        yield b'{"documents": ['
        for _ in range(100):
            yield b" " * 100
        yield b"]}"

    r = client.post("/api/v1/runs", content=chunks(), headers={**_auth(token), "content-type": "application/json"})
    assert r.status_code == 413
    headers = {**_auth(token), "content-type": "application/json"}
    assert client.post("/api/v1/runs", content=b"{not json", headers=headers).status_code == 422
    assert client.post("/api/v1/runs", json={"documents": [{"run_id": "x"}]}, headers=_auth(token)).status_code == 422
    nul = build.document()
    nul.suite = "bad\x00suite"
    r = client.post("/api/v1/runs", json=build.body(nul), headers=_auth(token))
    assert r.status_code in (201, 422), r.text  # SQLite stores a NUL; PostgreSQL refuses it: a 422, not a 500
    assert client.post("/api/v1/jobs/1/status", json={"status": "exploded"}, headers=_auth(token)).status_code == 422


def test_reads_can_require_a_token(app_client, db_url, build) -> None:
    client = app_client(read_token_required=True)
    token = build.token(db_url)
    assert client.get("/api/v1/runs").status_code == 401
    assert client.get("/").status_code == 401
    assert client.get("/api/v1/runs", headers=_auth(token)).status_code == 200
    open_client = app_client()
    assert open_client.get("/api/v1/runs").status_code == 200


def test_a_job_of_an_unknown_op_says_how_to_load_it(app_client, db_url, build) -> None:  # type: ignore[no-untyped-def]
    client = app_client()
    token = build.token(db_url, "alice")
    job = {"ops": ["leaky"], "shapes": ["B=1,T=8,D=4"], "device_kind": "cpu"}
    refused = client.post("/api/v1/jobs", json=job, headers=_auth(token))
    assert refused.status_code == 422
    assert (
        "unknown op 'leaky': start the server with --import FILE or install its deltabench.ops entry point"
        in refused.json()["detail"]
    ), refused.text
