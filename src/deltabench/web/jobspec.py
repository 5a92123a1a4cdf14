"""Checking a submitted job before it is queued, so a worker never receives a job it cannot read.

The stored spec is the JSON the workers expand (agreed with ``fleet/dispatch.py``)::

    {"suite": "smoke" | null, "ops": [...], "impls": [...], "shapes": ["B=1,T=100,H=2,K=16,V=32"],
     "dtypes": ["fp32"], "modes": ["fwd"], "device_kind": "cpu"}

Every name is checked against what this server knows (shipped suites, op contracts, registered impls); an
impl registered only on the worker (``--import``) is therefore refused here: put it in a suite file instead.
A job for the ``cpu`` kind whose largest case cannot fit in this host's memory (its inputs, the impl and the
oracle: correctness/memory_need.py, as ``deltabench run`` checks before its first job) is refused with the
estimate; the memory of a GPU kind's hosts is not known here, so their workers judge those jobs.
"""

from __future__ import annotations

from typing import Any

from deltabench.harness.errors import BadInput

from .schemas import JobSubmit

__all__ = ["validate_job"]


def _known_impls(ops: list[str]) -> set[str]:
    from deltabench.harness.registry import impls_for

    return {impl.name for op in ops for impl in impls_for(op)}


def validate_job(body: JobSubmit) -> dict[str, Any]:
    """The spec to store for `body`; BadInput (422) naming the first thing wrong."""
    from deltabench.correctness.memory_need import check_jobs_fit
    from deltabench.harness.cases import MODES, Case, parse_dtype, parse_shape
    from deltabench.harness.document import SERVER_REMEDY
    from deltabench.harness.ops import get_op
    from deltabench.harness.suites import load_suite, shipped_suites

    ops = list(dict.fromkeys(body.ops))
    for op in ops:
        get_op(op, SERVER_REMEDY)
    if body.suite is not None:
        if body.suite not in shipped_suites():
            raise BadInput(f"unknown suite {body.suite!r}: suites are {', '.join(shipped_suites())}")
        suite = load_suite(body.suite)
        in_suite = {plan.op for plan in suite.ops}
        outside = [op for op in ops if op not in in_suite]
        if outside:
            raise BadInput(f"suite {body.suite!r} has no op {outside[0]!r}: it has {', '.join(sorted(in_suite))}")
        scope = ops or sorted(in_suite)
    else:
        if not ops or not body.shapes:
            raise BadInput("a job without a suite needs ops and shapes")
        scope = ops
    shapes = []
    for shape in body.shapes:
        # a shape holds for every op of the job: each reads it with its own contract's dims
        parsed = [parse_shape(shape, op) for op in scope]
        dims = parsed[0]
        shapes.append(",".join(f"{d}={v}" for d, v in dims.items()))
    dtypes = [parse_dtype(d) for d in body.dtypes]
    for mode in body.modes:
        if mode not in MODES:
            raise BadInput(f"unknown mode {mode!r}: modes are {', '.join(MODES)}")
    if body.impls:
        known = _known_impls(scope)
        unknown = [i for i in body.impls if i not in known]
        if unknown:
            raise BadInput(f"unknown impl(s) {', '.join(map(repr, unknown))} for {', '.join(scope)}")
    if body.device_kind == "cpu":
        # A case that cannot fit in this host's memory (with gradients where the mode has a backward: the
        # largest need of any impl) is refused now, not stored as an oom point by the worker.
        check_jobs_fit(
            (Case(op, dtype=dtype, mode=mode, shape=parse_shape(shape, op)), None, "auto")
            for op in scope
            for shape in shapes
            for dtype in dtypes or ["fp32"]
            for mode in list(body.modes) or ["fwd"]
        )
    return {
        "suite": body.suite,
        "ops": ops,
        "impls": list(dict.fromkeys(body.impls)),
        "shapes": shapes,
        "dtypes": list(dict.fromkeys(dtypes)),
        "modes": list(dict.fromkeys(body.modes)),
        "device_kind": body.device_kind,
    }
