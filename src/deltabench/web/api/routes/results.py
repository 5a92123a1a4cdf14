"""``/results``: stored results filtered by op, impl, shape, dtype, mode, machine and commit range."""

from __future__ import annotations

import datetime as _dt
from typing import Annotated

from fastapi import APIRouter, Query

from deltabench.db import queries

from ... import schemas
from ...deps import ReadAccessDep, SessionDep
from ._common import ERRORS, Limit, Offset, Text

__all__ = ["router"]

router = APIRouter(prefix="/results", tags=["results"])


@router.get("", response_model=schemas.ResultsPublic, responses=ERRORS)
def find_results(
    session: SessionDep,
    _read: ReadAccessDep,
    op: Text = None,
    impl: Annotated[list[str] | None, Query(max_length=64)] = None,
    shape: Text = None,
    dtype: Text = None,
    mode: Text = None,
    machine: Text = None,
    status: Text = None,
    run: Text = None,
    commit_from: Text = None,
    commit_to: Text = None,
    since: Annotated[_dt.datetime | None, Query()] = None,
    until: Annotated[_dt.datetime | None, Query()] = None,
    limit: Limit = 100,
    offset: Offset = 0,
    before: Annotated[int | None, Query(ge=1, le=2**63 - 1)] = None,
) -> schemas.ResultsPublic:
    """Results matching every filter given, newest first.

    `shape` is any subset of the dims (``B8-T4096`` or ``B=8,T=4096``); `commit_from`/`commit_to` (commit
    prefixes, both or neither) bound the range from the first run of one commit to the last run of the other.
    Page with `before` (the previous page's `next_before`): each page costs the same however deep.
    """
    if (commit_from is None) != (commit_to is None):
        from deltabench.harness.errors import BadInput

        raise BadInput("give both commit_from and commit_to, or neither")
    impls = [i for i in impl or [] if "\x00" not in i] or None
    rows = queries.find_results(
        session,
        run_id=run,
        op=op,
        impl=impls,
        shape=shape,
        dtype=dtype,
        mode=mode,
        machine_kind=machine,
        status=status,
        commit_range=(commit_from, commit_to) if commit_from is not None else None,  # type: ignore[arg-type]
        since=since,
        until=until,
        limit=limit,
        offset=offset,
        before=before,
    )
    run_ids = queries.run_ids_by_pk(session, run_pks=[r.run_pk for r in rows])
    data = [schemas.ResultPublic.model_validate({**_columns(r), "run_id": run_ids.get(r.run_pk, "")}) for r in rows]
    return schemas.ResultsPublic(data=data, count=len(data), next_before=rows[-1].id if len(rows) == limit else None)


def _columns(row: object) -> dict[str, object]:
    return {name: getattr(row, name) for name in schemas.ResultPublic.model_fields if name != "run_id"}
