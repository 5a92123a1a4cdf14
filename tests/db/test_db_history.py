"""``db.history.history_spreads``: each base job's run-to-run spread from the stored runs before it (SQLite and
PostgreSQL)."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pytest

from deltabench.db.engine import session_scope
from deltabench.db.history import history_spreads
from deltabench.db.ingest import ingest_document

T0 = dt.datetime(2026, 3, 1, tzinfo=dt.timezone.utc)
KEY = ("gdn", "torch_chunk", "B2-T1024-H4-K64-V64", "bf16", "fwd")


def test_history_spreads_read_the_runs_up_to_the_base_without_the_head(engine, factory) -> None:  # type: ignore[no-untyped-def]
    levels = [1.00, 1.03, 0.98, 1.01, 1.02]
    runs = [
        factory.document(
            jobs=[
                factory.job(impl="torch_chunk", median=m),
                factory.job(impl="triton_chunk", median=0.5),
                factory.job(impl="fla_chunk", status="failed"),
            ],
            created_at=T0 + dt.timedelta(hours=i),
        )
        for i, m in enumerate(levels)
    ]
    head = factory.document(jobs=[factory.job(impl="torch_chunk", median=9.0)], created_at=T0 + dt.timedelta(hours=9))
    later = factory.document(jobs=[factory.job(impl="torch_chunk", median=5.0)], created_at=T0 + dt.timedelta(hours=8))
    elsewhere = factory.document(
        jobs=[factory.job(impl="torch_chunk", median=7.0)],
        created_at=T0 + dt.timedelta(hours=2, minutes=30),
        machine_kind="a100",
    )
    other_torch = factory.document(
        jobs=[factory.job(impl="torch_chunk", median=3.0)],
        created_at=T0 + dt.timedelta(hours=1, minutes=30),
        torch="2.12.0",
    )
    with session_scope(engine) as s:
        for doc in (*runs, head, later, elsewhere, other_torch):
            ingest_document(s, doc)
    base = runs[-1]
    with session_scope(engine) as s:
        got = history_spreads(s, base_run_id=base.run_id, exclude_run_id=head.run_id)
        assert history_spreads(s, base_run_id="nope") == {}
        # Two runs up to the first: too few for a spread.
        assert history_spreads(s, base_run_id=runs[1].run_id) == {}
    # Only the 5 same-machine, same-software runs up to the base count; failed jobs have no spread.
    assert set(got) == {KEY, ("gdn", "triton_chunk", "B2-T1024-H4-K64-V64", "bf16", "fwd")}
    spread = got[KEY]
    assert spread.source == "history" and spread.runs == 5
    bests = np.array([0.98 * m for m in levels])  # the fixture's samples reach 2% under the median
    assert spread.center_ms == pytest.approx(float(np.exp(np.log(bests).mean())))
    assert spread.sigma == pytest.approx(float(np.std(np.log(bests), ddof=1)))


def test_levels_are_run_level_of_each_result() -> None:
    """The history's run levels, taken together for speed, are ``noise.run_level`` of each stored result: its best
    sample, the median of its repetitions' best samples, or its median without samples (NULL or empty)."""
    from deltabench.db.history import _levels
    from deltabench.db.ingest import pack_repetitions, pack_samples
    from deltabench.regression.noise import run_level

    rng = np.random.default_rng(4)
    results: list[tuple[float, bytes | None, bytes | None]] = []
    expected = []
    for i in range(300):
        samples = rng.lognormal(0.0, 0.05, int(rng.integers(1, 25))).tolist()
        reps = [j % 3 for j in range(len(samples))] if i % 4 == 0 else []
        median = float(np.median(samples))
        blob = None if i % 7 == 0 else b"" if i % 11 == 0 else pack_samples(samples)
        results.append((median, blob, pack_repetitions(reps) if blob else None))
        expected.append(median if not blob else run_level(samples, median, reps))
    assert _levels(results) == expected
    assert _levels([]) == []


def test_levels_stored_at_ingest_and_rows_without_one_read_from_their_samples(engine, factory) -> None:  # type: ignore[no-untyped-def]
    """Ingest stores each timed result's ``noise.run_level`` in ``results.level_ms``; the history reads it, and
    results stored before that column (NULL) give the very same spreads from their raw samples."""
    from sqlalchemy import select, update

    from deltabench.db.ingest import unpack_samples
    from deltabench.db.models import Result, ResultSamples
    from deltabench.regression.noise import run_level

    runs = [
        factory.document(
            jobs=[factory.job(impl="torch_chunk", median=m), factory.job(impl="triton_chunk", median=m / 2)],
            created_at=T0 + dt.timedelta(hours=i),
        )
        for i, m in enumerate([1.00, 1.04, 0.97, 1.02, 1.01, 0.99])
    ]
    with session_scope(engine) as s:
        for doc in runs:
            ingest_document(s, doc)
    with session_scope(engine) as s:
        stored = s.execute(
            select(Result.level_ms, Result.median_ms, ResultSamples.samples).join(
                ResultSamples, ResultSamples.result_id == Result.id
            )
        ).all()
        assert len(stored) == 12
        for level, median, blob in stored:
            assert level == run_level(unpack_samples(blob), median) and level < median
        with_levels = history_spreads(s, base_run_id=runs[-1].run_id)
        s.execute(update(Result).where(Result.impl == "torch_chunk").values(level_ms=None))  # half "stored before"
        mixed = history_spreads(s, base_run_id=runs[-1].run_id)
        s.execute(update(Result).values(level_ms=None))
        without = history_spreads(s, base_run_id=runs[-1].run_id)
    assert len(with_levels) == 2
    assert with_levels == mixed == without
