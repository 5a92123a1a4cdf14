"""The run-to-run spread of each job of a stored base run, from its series' history in the store (what the gate
holds a head against; ``harness.regression.noise`` defines the model)."""

from __future__ import annotations

from collections import defaultdict

from deltabench.harness.regression.noise import HISTORY_WINDOW, RunSpread, spread_from_history
from deltabench.harness.series import JobKey
from sqlalchemy import select
from sqlalchemy.orm import Session

from .models import Result, Run

__all__ = ["history_spreads"]


def history_spreads(
    session: Session, *, base_run_id: str, exclude_run_id: str | None = None
) -> dict[JobKey, RunSpread]:
    """Each ok job of the stored run `base_run_id` with its run-to-run spread, from the medians of the same job
    (op, impl, shape, dtype, mode, major software) in the newest :data:`HISTORY_WINDOW` runs on the same machine
    class created up to the base, without `exclude_run_id` (the head). Jobs with too little history are left out
    (the machine class's default spread applies); an unknown base run gives no spreads.

    Two queries whatever the number of jobs: the window's runs, then their ok results.
    """
    base = session.execute(select(Run.id, Run.created_at).where(Run.run_id == base_run_id)).first()
    if base is None:
        return {}
    kind = session.scalar(select(Result.machine_kind).where(Result.run_pk == base.id).limit(1))
    if kind is None:
        return {}
    window = (
        select(Result.run_pk, Result.run_created_at)
        .join(Run, Result.run_pk == Run.id)
        .where(Result.machine_kind == kind, Result.run_created_at <= base.created_at)
        .group_by(Result.run_pk, Result.run_created_at)
        .order_by(Result.run_created_at.desc(), Result.run_pk.desc())
        .limit(HISTORY_WINDOW + 2)
    )
    if exclude_run_id is not None:
        window = window.where(Run.run_id != exclude_run_id)
    run_order = {pk: i for i, (pk, _) in enumerate(reversed(session.execute(window).all()))}
    if base.id not in run_order:
        return {}
    rows = session.execute(
        select(
            Result.run_pk,
            Result.op,
            Result.impl,
            Result.B,
            Result.T,
            Result.H,
            Result.K,
            Result.V,
            Result.dtype,
            Result.mode,
            Result.software,
            Result.median_ms,
            Result.attempt,
        ).where(Result.run_pk.in_(list(run_order)), Result.status == "ok", Result.median_ms > 0)
    ).all()
    # One median per (series, run): the highest attempt, as a comparison takes it.
    per_run: dict[tuple[JobKey, str], dict[int, tuple[int, float]]] = defaultdict(dict)
    base_series: dict[JobKey, str] = {}
    for r in rows:
        key: JobKey = (r.op, r.impl, f"B{r.B}-T{r.T}-H{r.H}-K{r.K}-V{r.V}", r.dtype, r.mode)
        runs = per_run[(key, r.software)]
        if r.run_pk not in runs or r.attempt >= runs[r.run_pk][0]:
            runs[r.run_pk] = (r.attempt, float(r.median_ms))
        if r.run_pk == base.id:
            base_series[key] = r.software
    out: dict[JobKey, RunSpread] = {}
    for key, software in base_series.items():
        runs = per_run[(key, software)]
        medians = [runs[pk][1] for pk in sorted(runs, key=run_order.__getitem__)]  # oldest first, the base last
        spread = spread_from_history(medians)
        if spread is not None:
            out[key] = spread
    return out
