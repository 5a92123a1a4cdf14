"""The run-to-run spread of each job of a stored base run, from its series' history in the store (what the gate
holds a head against; ``harness.regression.noise`` defines the model and the run level: a result's best sample,
its median when it has no raw samples)."""

from __future__ import annotations

from collections import defaultdict
from operator import itemgetter
from typing import Any

import numpy as np
from sqlalchemy import exists, select
from sqlalchemy.orm import Session

from deltabench.harness.series import JobKey
from deltabench.references.contract import shape_id
from deltabench.regression.noise import HISTORY_WINDOW, RunSpread, run_level, spreads_from_histories

from .dims import dims_of
from .ingest import unpack_repetitions, unpack_samples
from .models import Machine, Result, ResultSamples, Run

__all__ = ["history_spreads"]


def history_spreads(
    session: Session, *, base_run_id: str, exclude_run_id: str | None = None
) -> dict[JobKey, RunSpread]:
    """Each ok job of the stored run `base_run_id` with its run-to-run spread, from the medians of the same job
    (op, impl, shape, dtype, mode, major software) in the newest :data:`HISTORY_WINDOW` runs on the same machine
    class created up to the base, without `exclude_run_id` (the head). Jobs with too little history are left out
    (the machine class's default spread applies); an unknown base run gives no spreads. The jobs' bounds are
    widened together when their pooled history is heavier-tailed than the bound assumes
    (``noise.spreads_from_histories``).

    Two queries whatever the number of jobs: the window's runs, and their ok results with their levels (a third
    reads the raw samples of results stored before migration 0011, when the window holds any).
    """
    base = session.execute(select(Run.id, Run.created_at).where(Run.run_id == base_run_id)).first()
    if base is None:
        return {}
    kind = session.scalar(select(Result.machine_kind).where(Result.run_pk == base.id).limit(1))
    if kind is None:
        return {}
    # The newest runs with results on the machine class, read from runs (newest first by their index) rather than
    # by grouping results: SQLite grouped every result of the class up to the base before keeping 32 runs.
    has_results = exists().where(Result.run_pk == Run.id)
    window = (
        select(Run.id, Run.created_at)
        .join(Machine, Run.machine_id == Machine.id)
        .where(Machine.machine_kind == kind, Run.created_at <= base.created_at, has_results)
        .order_by(Run.created_at.desc(), Run.id.desc())
        .limit(HISTORY_WINDOW + 2)
    )
    if exclude_run_id is not None:
        window = window.where(Run.run_id != exclude_run_id)
    run_order = {pk: i for i, (pk, _) in enumerate(reversed(session.execute(window).all()))}
    if base.id not in run_order:
        return {}
    # The results with their run levels, made at ingest (results.level_ms); Core columns: the ORM's row processing
    # of the same select cost a tenth of a first view. Results stored before the column (NULL) take theirs from
    # their raw samples, read for those rows alone.
    results = Result.__table__
    in_window = (results.c.run_pk.in_(list(run_order)), results.c.status == "ok", results.c.median_ms > 0)
    rows = session.execute(
        select(
            results.c.run_pk,
            results.c.op,
            results.c.impl,
            results.c.B,
            results.c.T,
            results.c.H,
            results.c.K,
            results.c.V,
            results.c.extra_dims,
            results.c.dtype,
            results.c.mode,
            results.c.software,
            results.c.attempt,
            results.c.level_ms,
            results.c.id,
        ).where(*in_window)
    ).all()
    stored_before = None in map(itemgetter(-2), rows)  # level_ms, read by position: a Row's names cost ~1 us each
    levels_of = _levels_from_samples(session, in_window) if stored_before else {}
    # One result per (series, run): the highest attempt, as a comparison takes it.
    per_run: dict[tuple[JobKey, str], dict[int, tuple[int, float]]] = defaultdict(dict)
    base_series: dict[JobKey, str] = {}
    shapes: dict[tuple[Any, ...], str] = {}  # ~100 distinct shapes among ~3,000 rows: each id built once
    for run_pk, op, impl, b, t, h, k, v, extra, dtype, mode, software, attempt, level, result_id in rows:
        dims = (b, t, h, k, v, extra)
        shape = shapes.get(dims)
        if shape is None:
            shape = shapes[dims] = shape_id(dims_of(*dims))
        key: JobKey = (op, impl, shape, dtype, mode)
        runs = per_run[(key, software)]
        if run_pk not in runs or attempt >= runs[run_pk][0]:
            runs[run_pk] = (attempt, level if level is not None else levels_of[result_id])
        if run_pk == base.id:
            base_series[key] = software
    levels: dict[JobKey, list[float]] = {}
    for key, software in base_series.items():
        runs = per_run[(key, software)]
        levels[key] = [runs[pk][1] for pk in sorted(runs, key=run_order.__getitem__)]  # oldest first, the base last
    return spreads_from_histories(levels)


def _levels_from_samples(session: Session, in_window: tuple[Any, ...]) -> dict[int, float]:
    """The run levels of the window's results stored without one (before migration 0011), by result id, from their
    raw samples (an outer join: a result may have none)."""
    results, samples = Result.__table__, ResultSamples.__table__
    rows = session.execute(
        select(results.c.id, results.c.median_ms, samples.c.samples, samples.c.repetitions)
        .outerjoin(samples, samples.c.result_id == results.c.id)
        .where(*in_window, results.c.level_ms.is_(None))
    ).all()
    return dict(zip([row.id for row in rows], _levels([tuple(row)[1:] for row in rows]), strict=True))


def _levels(results: list[tuple[float, bytes | None, bytes | None]]) -> list[float]:
    """Each stored result's run level (``noise.run_level``) from its median and its packed samples, if any, in
    order. A result of one repetition (no repetition indices) has its best sample for level: those are taken
    together, one ``minimum.reduceat`` over their samples side by side (a comparison reads ~3,000 results; one by
    one, unpacking and ``run_level`` were a fifth of its first view). The rest go through ``run_level``."""
    out: list[float] = [0.0] * len(results)
    plain: list[int] = []
    blobs: list[bytes] = []
    for i, (median_ms, blob, repetitions) in enumerate(results):
        if blob and not repetitions:
            plain.append(i)
            blobs.append(blob)
        elif blob is None:
            out[i] = median_ms
        else:
            out[i] = run_level(unpack_samples(blob), median_ms, unpack_repetitions(repetitions))
    if plain:
        starts = np.cumsum([0] + [len(blob) // 8 for blob in blobs[:-1]])
        bests = np.minimum.reduceat(np.frombuffer(b"".join(blobs), dtype="<f8"), starts)
        for i, best in zip(plain, bests.tolist(), strict=True):
            out[i] = best
    return out
