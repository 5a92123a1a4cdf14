"""The API's documentation page (``/api/v1/docs``), Swagger UI served from local files.

FastAPI's own docs page loads Swagger UI from a CDN, which leaves a blank page on a machine without internet
access. The JavaScript and CSS here come from the installed ``fastapi-offline`` package (Swagger UI 5, which reads
the OpenAPI 3.1 schema FastAPI writes; Swagger UI is Apache-2.0, the package MIT) and are served by the app itself.
"""

from __future__ import annotations

import pathlib

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse

__all__ = ["DOCS_ASSETS", "api_docs_assets_dir", "install_api_docs"]

# URL name -> (file in the package's static folder, media type)
DOCS_ASSETS = {
    "swagger-ui-bundle.js": ("swagger-ui-bundle.js", "text/javascript"),
    "swagger-ui.css": ("swagger-ui.css", "text/css"),
    "favicon.png": ("favicon.png", "image/png"),
}
ASSETS_URL = "/static/api-docs"


def api_docs_assets_dir() -> pathlib.Path:
    """The folder of Swagger UI's files inside the installed ``fastapi-offline`` package."""
    import fastapi_offline

    return pathlib.Path(fastapi_offline.__file__).resolve().parent / "static"


def install_api_docs(app: FastAPI, *, docs_url: str = "/api/v1/docs") -> None:
    """Serve Swagger UI for `app`'s OpenAPI schema at `docs_url`, its assets under ``/static/api-docs/``.

    Create `app` with ``docs_url=None`` so FastAPI's CDN page does not take the route first.
    """
    openapi_url = app.openapi_url or "/openapi.json"
    try:
        folder = api_docs_assets_dir()
    except ImportError:
        # An install that predates the dependency still serves everything else; the page says what is missing.
        missing = "Swagger UI's files are missing: pip install fastapi-offline (part of deltabench[web])."

        @app.get(docs_url, include_in_schema=False)
        def _no_docs() -> HTMLResponse:
            body = f"<!doctype html><title>API docs</title><p>{missing} The schema is at <a href='{openapi_url}'>"
            return HTMLResponse(body + f"{openapi_url}</a>.</p>", status_code=503)

        return

    @app.get(docs_url, include_in_schema=False)
    def _docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi_url,
            title=f"{app.title} API",
            swagger_js_url=f"{ASSETS_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS_URL}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS_URL}/favicon.png",
            oauth2_redirect_url=None,
        )

    for name, (filename, media_type) in DOCS_ASSETS.items():
        app.add_api_route(
            f"{ASSETS_URL}/{name}", _file_route(folder / filename, media_type), methods=["GET"], include_in_schema=False
        )


def _file_route(path: pathlib.Path, media_type: str):  # type: ignore[no-untyped-def]
    # A closure, not default arguments: FastAPI would read those as query parameters.
    def serve() -> FileResponse:
        return FileResponse(path, media_type=media_type, headers={"Cache-Control": "max-age=86400"})

    return serve
