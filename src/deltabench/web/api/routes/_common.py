"""Bits the routers share: typed query parameters with bounds, and the error responses they document."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Query

from ... import schemas

__all__ = ["ERRORS", "WRITE_ERRORS", "Before", "Limit", "Offset", "Text"]

# Bounds keep every number a database accepts (SQLite's integers are 64-bit) and every page small.
Limit = Annotated[int, Query(ge=1, le=10_000, description="page size")]
Offset = Annotated[int, Query(ge=0, le=10_000_000, description="rows to skip")]
# A keyset cursor naming a row of a table keyed by a 32-bit id (jobs, annotations): the previous page's next_before.
Before = Annotated[int | None, Query(ge=1, le=2**31 - 1, description="the previous page's next_before")]
# A filter string: printable, short (PostgreSQL refuses NUL bytes in text, so they are refused here first).
Text = Annotated[str | None, Query(max_length=512, pattern=r"^[^\x00]*$")]

ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": schemas.Message, "description": "a token is needed"},
    403: {"model": schemas.Message, "description": "the token is unknown or revoked"},
    404: {"model": schemas.Message, "description": "not stored"},
    422: {"description": "malformed input"},
}
WRITE_ERRORS: dict[int | str, dict[str, Any]] = {
    **ERRORS,
    413: {"model": schemas.Message, "description": "request body too large"},
}
