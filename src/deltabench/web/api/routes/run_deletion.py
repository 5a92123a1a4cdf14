"""``DELETE /runs/{run_id}``: remove a run stored by mistake (a write token is needed)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Request

from deltabench.db.deletion import delete_run
from deltabench.harness.document import ID_PATTERN

from ... import schemas
from ...deps import SessionDep, WriteTokenDep
from ._common import WRITE_ERRORS

__all__ = ["router"]

router = APIRouter(prefix="/runs", tags=["runs"])

RunId = Annotated[str, Path(pattern=ID_PATTERN, description="the run's exact id (not a prefix, not `latest`)")]


@router.delete("/{run_id}", response_model=schemas.Message, responses=WRITE_ERRORS)
def delete_run_route(run_id: RunId, request: Request, session: SessionDep, _token: WriteTokenDep) -> schemas.Message:
    """Delete a run and its results, samples and checks; 404 when no run has exactly this id."""
    n_results = delete_run(session, run_id=run_id)
    if n_results is None:
        raise HTTPException(status_code=404, detail=f"no run {run_id!r} (give its exact id)")
    from ...services import forget_runs

    forget_runs([run_id])
    session.commit()  # before the wake: the refresh must see the run gone
    request.app.state.series_refresher.wake()
    return schemas.Message(detail=f"deleted run {run_id} ({n_results} results)")
