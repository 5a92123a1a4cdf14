"""A request-body size limit, as plain ASGI middleware (so it also holds for chunked uploads).

A declared ``Content-Length`` over the limit is answered 413 at once; a body without one is counted as it
arrives and answered 413 as soon as it passes the limit, before the app sees any of it.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["BodySizeLimit"]

Scope = dict[str, Any]


class BodySizeLimit:
    """Refuse request bodies larger than `max_bytes` with ``413 {"detail": ...}``."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def _refuse(self, send: Any, declared: int | None) -> None:
        size = f"{declared} bytes" if declared is not None else "more"
        body = json.dumps({"detail": f"request body too large: {size}, the limit is {self.max_bytes} bytes"}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        declared = None
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = None
                break
        if declared is not None and declared > self.max_bytes:
            await self._refuse(send, declared)
            return
        # Read the whole body first (it is below the limit or gets refused), then replay it to the app.
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._refuse(send, None)
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)
