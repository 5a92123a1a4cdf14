"""The FastAPI application: ``create_app(settings)`` wires the database, the API, the pages and the assets.

Errors never surface as a 500 for bad input: :class:`~deltabench.harness.errors.BadInput` is a 422 with its
reason (:class:`~deltabench.web.services.NotFound` a 404), a value the database refuses is a 422, and bodies
over the size limit are a 413 (see :mod:`.limits`). A malformed request is a 422 naming each field and rule,
quoting at most :data:`EXCERPT` characters of the input (never the body itself, which may be huge or not even
text). Writes to the API are authenticated before their body is read (:mod:`.auth_first`).
Every asset is served by the app itself, Plotly.js from the installed ``plotly`` package, so the dashboard works
on machines without internet access.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import pathlib
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel
from sqlalchemy.exc import DataError, StatementError
from starlette.exceptions import HTTPException

from deltabench.db.engine import get_engine
from deltabench.harness.errors import BadInput

from .api.main import api_router
from .api_docs import install_api_docs
from .auth_first import AuthenticateWritesFirst
from .config import Settings
from .limits import BodySizeLimit
from .pages.errors import install_page_error_handlers, validation_reason, wants_html
from .schemas import RunsIngest
from .series_refresh import SeriesRefresher
from .services import NotFound

__all__ = ["EXCERPT", "STATIC_DIR", "create_app", "plotly_js_path", "validation_errors"]

STATIC_DIR = pathlib.Path(__file__).resolve().parent / "static"
log = logging.getLogger(__name__)
EXCERPT = 120  # characters of an offending input quoted back in a 422
_MAX_ERRORS = 20  # validation errors listed in a 422


def _excerpt(value: object) -> str:
    if isinstance(value, (bytes, bytearray)):
        text = bytes(value[: EXCERPT * 4]).decode("utf-8", "replace")
    elif isinstance(value, str):
        text = value[: EXCERPT * 4]
    else:
        text = repr(value)[: EXCERPT * 4] if not isinstance(value, (dict, list)) else f"<a JSON {type(value).__name__}>"
    text = text.encode("utf-8", "replace").decode("utf-8")  # lone surrogates cannot be sent
    return text if len(text) <= EXCERPT else text[:EXCERPT] + "..."


def validation_errors(errors: list[dict]) -> list[dict]:  # type: ignore[type-arg]
    """Pydantic's errors as a 422 lists them: where, the rule broken, its type, and a short excerpt of the input."""
    shown = []
    for error in errors[:_MAX_ERRORS]:
        item = {
            "loc": [str(part) if not isinstance(part, int) else part for part in error.get("loc", ())],
            "msg": str(error.get("msg", ""))[:500],
            "type": str(error.get("type", "")),
        }
        if "input" in error:
            item["input"] = _excerpt(error["input"])
        shown.append(item)
    if len(errors) > _MAX_ERRORS:
        shown.append({"loc": [], "msg": f"... and {len(errors) - _MAX_ERRORS} more errors", "type": "more"})
    return shown


def plotly_js_path() -> pathlib.Path:
    """The minified Plotly.js shipped inside the installed ``plotly`` package (served as /static/plotly.min.js)."""
    import plotly

    return pathlib.Path(plotly.__file__).resolve().parent / "package_data" / "plotly.min.js"


def _error(request: Request, status: int, detail: str) -> Response:
    if wants_html(request):
        from .pages.render import error_page

        return error_page(request, status, detail)
    return JSONResponse({"detail": detail}, status_code=status)


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Response:
        if wants_html(request):
            return _error(request, 422, validation_reason(exc))
        # Short excerpts of each offending input, never the whole body.
        return JSONResponse({"detail": validation_errors(list(exc.errors()))}, status_code=422)

    @app.exception_handler(BadInput)
    async def _bad_input(request: Request, exc: BadInput) -> Response:
        return _error(request, 404 if isinstance(exc, NotFound) else 422, str(exc))

    @app.exception_handler(StatementError)
    async def _refused_by_db(request: Request, exc: StatementError) -> Response:
        # A value the database cannot hold (a NUL byte in PostgreSQL text, an integer out of range) is bad input.
        if isinstance(exc, DataError) or isinstance(exc.orig, ValueError):
            return _error(request, 422, f"the database refused a value: {str(exc.orig).splitlines()[0]}")
        log.exception("database error on %s", request.url.path)
        return _error(request, 500, "internal database error")

    @app.exception_handler(OverflowError)
    @app.exception_handler(UnicodeEncodeError)
    async def _unstorable(request: Request, exc: Exception) -> Response:
        # Raised by a database driver for a value it cannot bind (a 65-bit integer, a lone surrogate).
        return _error(request, 422, f"a value cannot be stored: {exc}")

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> Response:
        if wants_html(request):
            return _error(request, exc.status_code, str(exc.detail))
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)


@contextlib.asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Freeze what start-up allocated out of the garbage collector's sight; sweep the job queue and refresh the
    regressions table (:mod:`.series_refresh`) while serving.

    Everything imported by then (torch alone is some 200,000 objects) lives as long as the server; left tracked,
    every full collection walks it in the middle of some request. Measured with 1,000,000 stored results on
    SQLite, 500-job run pages: p95 253 ms before, 70 ms after (benchmarks/web_scale.py).
    """
    gc.collect()
    gc.freeze()
    sweeper = _start_job_sweeper(app)
    refresher = app.state.series_refresher.start()
    try:
        yield
    finally:
        refresher.stop()
        sweeper.stop()


def _start_job_sweeper(app: FastAPI):  # type: ignore[no-untyped-def]  # -> JobSweeper
    """Start failing (or queueing again) running jobs whose worker went silent (see :mod:`.job_sweeper`)."""
    from deltabench.db.jobs import heartbeat_timeout_s

    from .api.routes.jobs import dispatch_to_workers
    from .job_sweeper import JobSweeper

    timeout = app.state.settings.job_heartbeat_timeout_s or heartbeat_timeout_s()
    return JobSweeper(
        app.state.engine, timeout_s=timeout, redispatch=lambda job_id: dispatch_to_workers(app, job_id)
    ).start()


def _declare_body_schemas(app: FastAPI, models: dict[str, type[BaseModel]]) -> None:
    """Put `models`' JSON schemas (and the models they nest) under the OpenAPI schema's components: a route that
    parses its body itself (``POST /api/v1/runs`` reads raw bytes, for speed) names its body by ``$ref`` only, and
    FastAPI adds no component for a model no route parameter declares."""
    plain = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = plain()
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for name, model in models.items():
                body = model.model_json_schema(ref_template="#/components/schemas/{model}", mode="validation")
                for nested, definition in body.pop("$defs", {}).items():
                    components.setdefault(nested, definition)
                components[name] = body
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _dependency_calls(dependant: Any) -> set[Any]:
    """Every dependency function of a route, nested ones included."""
    calls = set()
    for dep in dependant.dependencies:
        calls.add(dep.call)
        calls |= _dependency_calls(dep)
    return calls


def _declare_open_reads(app: FastAPI) -> None:
    """Mark the reads that need no token (reads are open unless ``read_token_required``) as such in the OpenAPI
    schema: ``security: [{}, {HTTPBearer: []}]``, a token optional. FastAPI declares the bearer scheme of their
    optional credentials as required, which tells clients a read needs a token it does not."""
    from fastapi.routing import APIRoute

    from .deps import require_read_access, require_write_token

    try:  # FastAPI >= 0.13x includes routers lazily: its route contexts carry each route's full path
        from fastapi.routing import iter_route_contexts

        routes = [(c.original_route, c.path) for c in iter_route_contexts(app.routes)]
    except ImportError:  # pragma: no cover - older FastAPI lists every route, with its full path
        routes = [(r, getattr(r, "path_format", "")) for r in app.routes]
    if app.state.settings.read_token_required:
        return
    open_reads = {
        (path, method.lower())
        for route, path in routes
        if isinstance(route, APIRoute)
        and require_read_access in (calls := _dependency_calls(route.dependant))
        and require_write_token not in calls
        for method in route.methods
    }
    plain = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = plain()
            for path, operations in schema.get("paths", {}).items():
                for method, operation in operations.items():
                    if (path, method) in open_reads and operation.get("security"):
                        operation["security"] = [{}, *operation["security"]]
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def create_app(settings: Settings | None = None) -> FastAPI:
    """The dashboard and API for `settings` (default: from the environment); migrates the database on start."""
    settings = settings or Settings.from_env()
    app = FastAPI(
        title="deltabench",
        summary="Verified benchmarks of delta-rule sequence-mixer kernels: runs, comparisons, history, jobs.",
        version="1",
        openapi_url="/api/v1/openapi.json",
        docs_url=None,  # served by install_api_docs from local files, not FastAPI's CDN page
        redoc_url=None,
        lifespan=_lifespan,
    )
    app.state.settings = settings
    app.state.engine = get_engine(settings.db_url)
    app.state.series_refresher = SeriesRefresher(app.state.engine, settle_s=settings.series_refresh_settle_s)
    _install_error_handlers(app)
    install_page_error_handlers(app)
    app.include_router(api_router)
    _declare_body_schemas(app, {"RunsIngest": RunsIngest})
    _declare_open_reads(app)
    install_api_docs(app)

    from .pages.routes import router as pages_router

    app.include_router(pages_router)

    plotly_js = plotly_js_path()

    @app.get("/static/plotly.min.js", include_in_schema=False)
    def _plotly() -> FileResponse:
        return FileResponse(plotly_js, media_type="text/javascript", headers={"Cache-Control": "max-age=86400"})

    @app.get("/favicon.ico", include_in_schema=False)
    def _favicon() -> FileResponse:  # browsers ask for it whatever the page's <link rel="icon"> says
        return FileResponse(STATIC_DIR / "favicon.svg", media_type="image/svg+xml")

    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)
    # outermost: before any body is read
    app.add_middleware(AuthenticateWritesFirst, engine=app.state.engine, drain_bytes=settings.max_body_bytes)
    return app
