"""Removing a run stored by mistake: the run, its results, their samples and checks (machines and environments,
shared with other runs, stay)."""

from __future__ import annotations

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from .models import Check, Result, ResultSamples, Run
from .series_state import mark_run_dirty

__all__ = ["delete_run"]


def delete_run(session: Session, *, run_id: str) -> int | None:
    """Delete the run `run_id` (its exact id, never a prefix) and everything stored under it.

    Returns how many results it held, or None when no such run is stored. The caller's session commits.
    """
    run_pk = session.scalar(select(Run.id).where(Run.run_id == run_id))
    if run_pk is None:
        return None
    result_ids = select(Result.id).where(Result.run_pk == run_pk).scalar_subquery()
    n_results = session.scalar(select(func.count()).select_from(Result).where(Result.run_pk == run_pk)) or 0
    # The children first: they name their result without a foreign key (migration 0010), so nothing else removes
    # them.
    mark_run_dirty(session, run_pk)  # its series lose points: the regressions page recomputes them
    session.execute(delete(Check).where(Check.result_id.in_(result_ids)))
    session.execute(delete(ResultSamples).where(ResultSamples.result_id.in_(result_ids)))
    session.execute(delete(Result).where(Result.run_pk == run_pk))
    session.execute(delete(Run).where(Run.id == run_pk))
    return n_results
