"""A write is committed before its response goes out: a client that reads right after it sees it.

A real uvicorn (in a thread, so the test can slow the engine's commits down) on an SQLite file. Every commit
sleeps; if the session committed after the response was sent, the read that follows a 201 (or a form's redirect)
would run before the write is visible, as a browser once saw on the regressions page.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import uvicorn
from sqlalchemy import event

from deltabench.web.app import create_app
from deltabench.web.config import Settings

COMMIT_DELAY_S = 0.5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def slow_commit_server(sqlite_url: str, build) -> Iterator[tuple[str, str]]:  # type: ignore[no-untyped-def]
    """(base URL, write token) of a served app whose every commit takes COMMIT_DELAY_S."""
    token = build.token(sqlite_url)
    app = create_app(Settings(db_url=sqlite_url))
    event.listen(app.state.engine, "commit", lambda _conn: time.sleep(COMMIT_DELAY_S))
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}", token
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        app.state.series_refresher.stop()


def test_an_annotation_is_visible_as_soon_as_its_201_arrives(slow_commit_server: tuple[str, str]) -> None:
    base, token = slow_commit_server
    body = {"series_key": "gdn/torch_chunk/B1-T64-H2-K32-V32/fp32/fwd@cpu", "kind": "expected", "note": "why"}
    with httpx.Client(base_url=base, timeout=30) as client:
        r = client.post("/api/v1/annotations", json=body, headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 201, r.text
        listed = client.get("/api/v1/annotations").json()
    assert [a["note"] for a in listed["data"]] == ["why"], "the read after the 201 ran before the commit"


def test_a_form_redirect_shows_the_annotation_it_stored(slow_commit_server: tuple[str, str]) -> None:
    base, token = slow_commit_server
    form = {"series_key": "gdn/torch_chunk/B1-T64-H2-K32-V32/fp32/fwd@cpu", "kind": "acknowledged", "note": "seen"}
    with httpx.Client(base_url=base, timeout=30) as client:
        r = client.post("/regressions/annotate", data={**form, "token": token})
        assert r.status_code == 303, r.text
        listed = client.get("/api/v1/annotations").json()
    assert [a["note"] for a in listed["data"]] == ["seen"], "the page after the redirect ran before the commit"
