"""``/history`` and ``/series``: one series over time with its change points, and the list of series."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from deltabench.db import queries

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
    software: Text = None,
    limit: Annotated[int, Query(ge=2, le=5000)] = services.HISTORY_POINTS,
) -> schemas.HistoryPublic:
    """A series' newest `limit` ok results (oldest first) with median and IQR, change points and annotations.

    `shape` gives all five dims (``B8-T4096-H6-K128-V128``); `machine` is the machine kind; `software` the series'
    major.minor software versions (``python=3.11,torch=2.13``, as ``/series`` lists them; empty for none). Without
    `software`, the series the newest result of this case is in: results on other major software versions
    belong to other series and are never mixed in.
    """
    key = services.series_key_of(
        session, op=op, impl=impl, shape=shape, dtype=dtype, mode=mode, machine_kind=machine, software=software
    )
    return services.series_history(session, key, limit=limit)


@router.get("/series", responses=ERRORS)
def list_series(
    session: SessionDep,
    _read: ReadAccessDep,
    op: Text = None,
    impl: Text = None,
    machine: Text = None,
    limit: Limit = 1000,
    after: Text = None,
) -> dict[str, Any]:
    """The distinct series with at least one ok result, sorted by their fields. Page with `after` (the previous
    page's `next_after`: the last series' key)."""
    keys = queries.list_series(session, op=op, impl=impl, machine_kind=machine, limit=limit, after=after)
    data = [
        {
            "key": k.key,
            "op": k.op,
            "impl": k.impl,
            "shape": k.shape_id,
            "dtype": k.dtype,
            "mode": k.mode,
            "machine_kind": k.machine_kind,
            "software": k.software,
        }
        for k in keys
    ]
    return {"data": data, "count": len(data), "next_after": keys[-1].key if len(keys) == limit else None}
