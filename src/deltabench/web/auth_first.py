"""Writes to the API are authenticated before their body is read, as plain ASGI middleware.

FastAPI reads and parses a route's body before it runs the route's dependencies, so a write with a bogus token
and a malformed body was answered with the body's validation errors (and a large body was read, parsed and
echoed). This middleware answers a non-GET request under ``/api/`` 401 (no token) or 403 (unknown or revoked)
before the app receives a byte of its body; the routes still check the token themselves. The refused body is
then read and dropped (up to the server's body limit) before the answer is sent: a client still sending it would
otherwise meet a closed connection and never see the status (Python's urllib did; curl did not).
"""

from __future__ import annotations

import json
from http.cookies import SimpleCookie
from typing import Any

from fastapi import HTTPException
from sqlalchemy import Engine
from starlette.concurrency import run_in_threadpool

from deltabench.db.engine import session_scope

from .deps import TOKEN_COOKIE, check_token

__all__ = ["AuthenticateWritesFirst"]

_READS = frozenset({"GET", "HEAD", "OPTIONS"})


def _token(headers: list[tuple[bytes, bytes]]) -> str | None:
    cookie_token = None
    for name, value in headers:
        if name == b"authorization":
            scheme, _, credentials = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer" and credentials.strip():
                return credentials.strip()
        elif name == b"cookie":
            jar: SimpleCookie = SimpleCookie()
            try:
                jar.load(value.decode("latin-1"))
            except Exception:  # a malformed cookie header carries no token
                continue
            if TOKEN_COOKIE in jar:
                cookie_token = jar[TOKEN_COOKIE].value or None
    return cookie_token


class AuthenticateWritesFirst:
    """Answer an unauthenticated write under ``/api/`` with 401/403 before its body is read."""

    def __init__(self, app: Any, engine: Engine, drain_bytes: int = 0) -> None:
        self.app = app
        self.engine = engine
        self.drain_bytes = drain_bytes  # how much of a refused body is read and dropped before the answer

    def _check(self, token: str | None) -> None:
        with session_scope(self.engine) as session:
            check_token(session, token)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] in _READS or not scope["path"].startswith("/api/"):
            await self.app(scope, receive, send)
            return
        try:
            await run_in_threadpool(self._check, _token(scope.get("headers", [])))
        except HTTPException as exc:
            drained = await self._drain(receive)
            body = json.dumps({"detail": exc.detail}).encode()
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
            if not drained:  # a body beyond the limit is left unread: the connection cannot be reused
                headers.append((b"connection", b"close"))
            headers += [(k.lower().encode(), v.encode()) for k, v in (exc.headers or {}).items()]
            await send({"type": "http.response.start", "status": exc.status_code, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)

    async def _drain(self, receive: Any) -> bool:
        """Read and drop the request's body, up to :attr:`drain_bytes`; whether it was read to its end."""
        seen = 0
        while seen <= self.drain_bytes:
            message = await receive()
            if message["type"] != "http.request":
                return False  # the client went away
            seen += len(message.get("body", b""))
            if not message.get("more_body", False):
                return True
        return False
