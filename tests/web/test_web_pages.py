"""Server-rendered pages over the real app: every user string escaped, errors as pages, assets served locally."""

from __future__ import annotations

import pytest

from deltabench.cli.app import main

XSS = '<script>alert("x")</script>'


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_user_strings_are_escaped_everywhere(app_client, db_url, build) -> None:
    client = app_client()
    token = build.token(db_url)
    job = build.job(impl=XSS, status="failed", reason=XSS)
    doc = build.document(jobs=[build.job(impl="torch_chunk"), job])
    doc.suite = XSS
    assert client.post("/api/v1/runs", json=build.body(doc), headers=_auth(token)).status_code == 201
    note = {"series_key": XSS, "kind": "expected", "note": XSS}
    assert client.post("/api/v1/annotations", json=note, headers=_auth(token)).status_code == 201
    html = {"accept": "text/html"}
    for url in ("/", f"/runs/{doc.run_id}", f"/compare?run={doc.run_id}&base_impl=torch_chunk&head_impl={XSS}"):
        page = client.get(url, headers=html)
        assert page.status_code == 200, (url, page.text[:300])
        assert XSS not in page.text, url
    assert "&lt;script&gt;" in client.get(f"/runs/{doc.run_id}").text
    missing = client.get(f"/runs/{XSS}", headers=html)
    assert missing.status_code == 404 and XSS not in missing.text and "<h1>Error 404</h1>" in missing.text


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_assets_are_served_by_the_app(app_client) -> None:
    client = app_client()
    plotly = client.get("/static/plotly.min.js")
    assert plotly.status_code == 200 and len(plotly.content) > 1_000_000 and b"plotly" in plotly.content[:2000].lower()
    assert client.get("/static/history.js").status_code == 200
    assert client.get("/static/style.css").status_code == 200
    icon = client.get("/favicon.ico")
    assert icon.status_code == 200 and icon.headers["content-type"].startswith("image/svg+xml")
    for url in ("/", "/jobs", "/history", "/regressions", "/compare"):
        page = client.get(url)
        assert page.status_code == 200
        assert "http://" not in page.text.replace("http://testserver", "") and "https://" not in page.text, url


def test_token_commands(sqlite_url, capsys) -> None:  # type: ignore[no-untyped-def]
    def cli(*args: str) -> int:
        with pytest.raises(SystemExit) as stop:
            main(list(args))
        return stop.value.code  # type: ignore[return-value]

    assert cli("token", "create", "--name", "ci-bot", "--db", sqlite_url) == 0
    token = capsys.readouterr().out.strip()
    assert token.startswith("dbt_") and len(token) > 40
    assert cli("token", "create", "--name", "ci-bot", "--db", sqlite_url) == 2
    assert "exists already" in capsys.readouterr().err
    assert cli("token", "list", "--db", sqlite_url) == 0
    listing = capsys.readouterr().out
    assert "ci-bot" in listing and "active" in listing and token not in listing
    from sqlalchemy import select

    from deltabench.db.engine import get_engine, session_scope
    from deltabench.db.models import ApiToken
    from deltabench.web.security.tokens import authenticate, hash_token

    with session_scope(get_engine(sqlite_url)) as session:
        stored = session.scalar(select(ApiToken.token_sha256))
        assert stored == hash_token(token), "only the hash is stored"
        assert authenticate(session, token) is not None
    assert cli("token", "revoke", "ci-bot", "--db", sqlite_url) == 0
    assert cli("token", "revoke", "nobody", "--db", sqlite_url) == 2
    with session_scope(get_engine(sqlite_url)) as session:
        assert authenticate(session, token) is None


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_row_without_a_test_shows_no_p_value(app_client, db_url, build) -> None:
    """Three samples a side: too few to judge, no test ran; its p cell says '-' (as the CLI), not 'p = 1'."""
    import re

    client = app_client()
    token = build.token(db_url)
    base, head = (build.document(jobs=[build.job(median=m, n=3)]) for m in (1.0, 1.1))
    for doc in (base, head):
        assert client.post("/api/v1/runs", json=build.body(doc), headers=_auth(token)).status_code == 201
    page = client.get(f"/compare?base={base.run_id}&head={head.run_id}").text
    [row] = re.findall(r"<tr class=\"o-[^\"]*\">(.*?)</tr>", page, flags=re.DOTALL)
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row, flags=re.DOTALL)
    assert "too few samples" in cells[-1]
    assert cells[9] == "-", cells  # the p column


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_run_page_shows_the_gpu_state_beside_the_timing(app_client, db_url, build) -> None:
    """A job timed with NVML's readings (two of its twelve windows power-capped or below the clock norm) shows its SM
    clock and the windows left out under its time, the records' details as the tooltip; a job without shows none."""
    from deltabench.runners.hwstate import WindowState, filter_samples, hardware_records

    ok = WindowState(1980.0, 3201.0, 520.0, 61.0, reasons=0)
    states = [ok] * 5 + [WindowState(1980.0, 3201.0, 700.0, 63.0, reasons=0x4)] + [ok] * 5
    states.append(WindowState(1700.0, 3201.0, 450.0, 60.0, reasons=0))
    _, record = filter_samples([[1.0, 1.01]] * 12, states)
    timed = build.job(impl="triton_chunk")
    timed.device = "cuda"
    timed.verification = [*timed.verification, *hardware_records(record)]
    doc = build.document(jobs=[timed, build.job(impl="torch_chunk")])
    client = app_client()
    assert client.post("/api/v1/runs", json=build.body(doc), headers=_auth(build.token(db_url))).status_code == 201
    page = client.get(f"/runs/{doc.run_id}").text
    assert page.count('class="muted hardware"') == 1
    assert "SM 1980 MHz" in page and "2 throttled windows left out" in page
    assert "2 of 12 windows excluded (sw_power_cap 1, SM clock below 97% of 1980 MHz 1)" in page
