"""The result document's own rules: what harness/ops.py and the runners produce is what it accepts."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from deltabench.harness import document
from deltabench.harness.ops import OPS
from deltabench.harness.pytest_benchmark import EXTERNAL_OP


def test_known_ops_are_the_op_contracts_and_imported_summaries() -> None:
    assert set(document.BUILTIN_OPS) == set(OPS)
    assert document.IMPORTED_OP == EXTERNAL_OP
    assert set(OPS) | {EXTERNAL_OP} <= document.known_ops()


def test_the_built_in_ops_are_the_reference_modules() -> None:
    """A built-in op is a references/<op>.py declaring CONTRACT: the op list is read from the package, so adding
    the module adds the op (no list to edit), and each module's contract is named after it."""
    import importlib

    from deltabench.references import builtin_op_modules

    assert builtin_op_modules() == ("gdn", "gdn2", "gdn_layer", "kda", "lm_step", "sdm")
    for name in builtin_op_modules():
        assert importlib.import_module(f"deltabench.references.{name}").CONTRACT.name == name
    assert list(OPS)[: len(builtin_op_modules())] == list(builtin_op_modules())


def test_a_registered_op_name_is_accepted() -> None:
    with pytest.raises(ValidationError, match="unknown op 'plugin_op'"):
        document.CaseSpec(op="plugin_op", B=1, T=1, H=1, K=1, V=1, dtype="fp32")
    document.register_op_name("plugin_op")
    try:
        assert document.CaseSpec(op="plugin_op", B=1, T=1, H=1, K=1, V=1, dtype="fp32").op == "plugin_op"
    finally:
        document._registered_ops.discard("plugin_op")


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"median_ms": 1.0}, None),
        ({"median_ms": None}, "median_ms is missing"),
        ({"median_ms": float("inf")}, "median_ms must be finite"),
        ({"median_ms": 0.0}, "median_ms must be positive"),
        ({"median_ms": 1.0, "stdev_ms": -0.1}, "stdev_ms must not be negative"),
        ({"median_ms": 1.0, "samples_ms": [1.0, float("nan")]}, "samples_ms[1] must be finite"),
        # A NaN or an infinity anywhere, and a non-positive sample, whatever the others (min and max skip a NaN
        # placed after a finite value; an overflowing sum of finite samples is fine).
        ({"median_ms": 1.0, "samples_ms": [float("nan"), 1.0, 2.0]}, "samples_ms[0] must be finite"),
        ({"median_ms": 1.0, "samples_ms": [2.0, 1.0, float("nan"), 3.0]}, "samples_ms[2] must be finite"),
        ({"median_ms": 1.0, "samples_ms": [2.0, float("inf")]}, "samples_ms[1] must be finite"),
        ({"median_ms": 1.0, "samples_ms": [2.0, 0.0, 1.0]}, "samples_ms[1] must be positive"),
        ({"median_ms": 1.0, "samples_ms": [2.0, 1.0, -1e-300]}, "samples_ms[2] must be positive"),
        ({"median_ms": 1.0, "samples_ms": [1e308, 1e308, 1.0]}, None),
        ({"median_ms": 1.0, "samples_ms": []}, None),
    ],
)
def test_timing_problem(fields: dict, problem: str | None) -> None:
    got = document.timing_problem(**fields)
    assert got == problem if problem is None else got.startswith(problem)
