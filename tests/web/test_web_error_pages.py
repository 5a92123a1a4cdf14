"""Page routes answer errors with the error page (422 for a bad query, 500 for a server fault); API routes keep
JSON. (The browser test drives the 404 and 422 pages in Chromium; a 500 needs a route that fails, made here.)"""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from deltabench.web.app import create_app
from deltabench.web.config import Settings

HTML = {"accept": "text/html,application/xhtml+xml"}


@pytest.fixture
def client(sqlite_url: str) -> TestClient:
    app = create_app(Settings(db_url=sqlite_url))

    @app.get("/broken", include_in_schema=False)
    def broken() -> None:
        raise RuntimeError("secret internals")

    @app.get("/api/v1/broken", include_in_schema=False)
    def api_broken() -> None:
        raise RuntimeError("secret internals")

    return TestClient(app, raise_server_exceptions=False)


def test_server_error_is_a_page_for_pages_and_json_for_the_api(client: TestClient) -> None:
    page = client.get("/broken", headers=HTML)
    assert page.status_code == 500 and page.headers["content-type"].startswith("text/html")
    assert "<h1>Error 500</h1>" in page.text and "secret internals" not in page.text
    api = client.get("/api/v1/broken", headers=HTML)
    assert api.status_code == 500 and api.json() == {"detail": "internal server error"}


def test_bad_query_is_a_page_for_pages_and_json_for_the_api(client: TestClient) -> None:
    page = client.get("/?page=abc", headers=HTML)
    assert page.status_code == 422 and page.headers["content-type"].startswith("text/html")
    assert "page: Input should be a valid integer" in page.text and "(got &#39;abc&#39;)" in page.text
    # Without text/html in Accept (curl, scripts), pages answer JSON like the API.
    assert client.get("/?page=abc").json()["detail"][0]["loc"] == ["query", "page"]
    api = client.get("/api/v1/runs?limit=abc", headers=HTML)
    assert api.status_code == 422 and api.json()["detail"][0]["loc"] == ["query", "limit"]


def test_api_docs_without_swagger_ui_files_say_what_is_missing(sqlite_url: str, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import sys

    monkeypatch.setitem(sys.modules, "fastapi_offline", None)  # as on an install that predates the dependency
    client = TestClient(create_app(Settings(db_url=sqlite_url)))
    docs = client.get("/api/v1/docs")
    assert docs.status_code == 503 and "pip install fastapi-offline" in docs.text
    assert client.get("/", headers=HTML).status_code == 200, "everything else is served"
