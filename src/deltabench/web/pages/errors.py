"""Error pages for the dashboard's page routes: a request a page cannot take (``/?page=abc``) or a server error
answers with an HTML page giving the status and the reason, as any other page error does (``app._error``); API
routes keep their JSON bodies (the validation detail with short excerpts, ``{"detail": ...}`` for a server error).
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response

__all__ = ["install_page_error_handlers", "validation_reason"]

log = logging.getLogger(__name__)

# Where a request value came from, as FastAPI names it in an error's location; not worth showing.
_SOURCES = {"query", "path", "body", "header", "cookie"}


def validation_reason(exc: RequestValidationError, limit: int = 3) -> str:
    """FastAPI's validation errors as one line: ``page: Input should be a valid integer (got 'abc')``."""
    parts = []
    for error in exc.errors()[:limit]:
        loc = ".".join(str(x) for x in error.get("loc", ()) if x not in _SOURCES) or "request"
        text = f"{loc}: {error.get('msg', 'invalid')}"
        if "input" in error and isinstance(error["input"], (str, int, float)):
            shown = repr(error["input"])
            text += f" (got {shown[:60]}{'...' if len(shown) > 60 else ''})"
        parts.append(text)
    more = len(exc.errors()) - limit
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def wants_html(request: Request) -> bool:
    """Whether `request` is a page's (answered with the error page) rather than the API's (answered in JSON)."""
    return not request.url.path.startswith("/api/") and "text/html" in request.headers.get("accept", "")


def install_page_error_handlers(app: FastAPI) -> None:
    """Answer page routes' unhandled exceptions (500) with the error page (their 422s go through the app's one
    validation handler, which words them with :func:`validation_reason`)."""
    from .render import error_page

    @app.exception_handler(Exception)
    async def _server_error(request: Request, exc: Exception) -> Response:
        # Starlette logs the exception after this answer; the page shows no traceback.
        if wants_html(request):
            return error_page(request, 500, "internal server error: the server's log has the details")
        return JSONResponse({"detail": "internal server error"}, status_code=500)
