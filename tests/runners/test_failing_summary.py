"""A job's ``incorrect`` reason: one clause per failing check, each with the seed, regime and variant it ran at."""

from __future__ import annotations

from deltabench.harness.document import CheckRecord
from deltabench.runners.job import failing_summary


def _failed(regime: str | None, initial_state: bool | None, value: float = 0.5) -> CheckRecord:
    return CheckRecord(
        check="output",
        metric="rel_fro",
        value=value,
        threshold=1e-2,
        passed=False,
        seed=0,
        regime=regime,
        initial_state=initial_state,
    )


def test_each_failure_says_where_it_ran() -> None:
    records = [_failed(r, h0) for r in ("typical", "long", "strong") for h0 in (False, True)]
    reason = failing_summary(records)
    assert reason == (
        "failed the gate: output rel_fro 5.00e-01 > 1.0e-02 (seed 0, regime typical, zero state); "
        "output rel_fro 5.00e-01 > 1.0e-02 (seed 0, regime typical, initial state); "
        "output rel_fro 5.00e-01 > 1.0e-02 (seed 0, regime long, zero state) and 3 more"
    )


def test_a_clause_said_twice_is_said_once() -> None:
    twice = [_failed("long", True), _failed("long", True), _failed(None, None, value=0.25)]
    assert failing_summary(twice) == (
        "failed the gate: output rel_fro 5.00e-01 > 1.0e-02 (seed 0, regime long, initial state); "
        "output rel_fro 2.50e-01 > 1.0e-02 (seed 0)"
    )


def test_a_failure_carries_its_detail() -> None:
    """The gate's detail of a failed comparison (how much of the error lies along the reference) joins its clause."""
    record = _failed("typical", True).model_copy(update={"detail": "+9.90e-03 along the reference"})
    assert failing_summary([record]) == (
        "failed the gate: output rel_fro 5.00e-01 > 1.0e-02 (seed 0, regime typical, initial state; "
        "+9.90e-03 along the reference)"
    )
