"""``/history`` and ``/series``: one series over time with its change points, and the list of series."""

from __future__ import annotations

from typing import Annotated, Any

from deltabench.db import queries
from fastapi import APIRouter, Query

from ... import schemas, services
from ...deps import ReadAccessDep, SessionDep
from ._common import ERRORS, Limit, Text

__all__ = ["router"]

router = APIRouter(tags=["history"])

Required = Annotated[str, Query(min_length=1, max_length=512, pattern=r"^[^\x00]*$")]


@router.get("/history", response_model=schemas.HistoryPublic, responses=ERRORS)
def history(
    session: SessionDep,
    _read: ReadAccessDep,
    op: Required,
    impl: Required,
    shape: Required,
    dtype: Required,
    mode: Required,
    machine: Required,
    limit: Annotated[int, Query(ge=2, le=5000)] = services.HISTORY_POINTS,
) -> schemas.HistoryPublic:
    """A series' newest `limit` ok results (oldest first) with median and IQR, change points and annotations.

    `shape` gives all five dims (``B8-T4096-H6-K128-V128``); `machine` is the machine kind.
    """
    key = services.series_key_of(op=op, impl=impl, shape=shape, dtype=dtype, mode=mode, machine_kind=machine)
    return services.series_history(session, key, limit=limit)


@router.get("/series", responses=ERRORS)
def list_series(
    session: SessionDep,
    _read: ReadAccessDep,
    op: Text = None,
    impl: Text = None,
    machine: Text = None,
    limit: Limit = 1000,
) -> dict[str, Any]:
    """The distinct series with at least one ok result, sorted by key."""
    keys = queries.list_series(session, op=op, impl=impl, machine_kind=machine, limit=limit)
    data = [
        {
            "key": k.key,
            "op": k.op,
            "impl": k.impl,
            "shape": "-".join(f"{d}{v}" for d, v in k.shape.items()),
            "dtype": k.dtype,
            "mode": k.mode,
            "machine_kind": k.machine_kind,
        }
        for k in keys
    ]
    return {"data": data, "count": len(data)}
