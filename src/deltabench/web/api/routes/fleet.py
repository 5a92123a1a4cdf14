"""``/workers`` and ``/machines``: who runs jobs, and which hosts stored runs."""

from __future__ import annotations

from fastapi import APIRouter

from deltabench.db import queries

from ... import schemas
from ...deps import ReadAccessDep, SessionDep
from ._common import ERRORS

__all__ = ["router"]

router = APIRouter(tags=["fleet"])


@router.get("/workers", response_model=schemas.WorkersPublic, responses=ERRORS)
def list_workers(session: SessionDep, _read: ReadAccessDep) -> schemas.WorkersPublic:
    """Workers that took jobs, most recently seen first, with their job counts."""
    rows = queries.list_workers(session)
    return schemas.WorkersPublic(data=[schemas.WorkerPublic(**vars(w)) for w in rows], count=len(rows))


@router.get("/machines", response_model=schemas.MachinesPublic, responses=ERRORS)
def list_machines(session: SessionDep, _read: ReadAccessDep) -> schemas.MachinesPublic:
    """Hosts that stored runs, by machine kind."""
    rows = queries.list_machines(session)
    return schemas.MachinesPublic(data=[schemas.MachinePublic.model_validate(m) for m in rows], count=len(rows))
