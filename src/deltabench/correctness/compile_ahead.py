"""What a run compiles before the gates of an impl that compiles each shape (runners/session.py, the compile stage).

The gate calls such an impl at some eight shapes a job (``verify.gate_shapes``), each new to its compile cache.
:func:`compile_ahead` makes those calls first, unchecked, so that the gates find their kernels built. For an impl
whose kernels a dry run can list (``Impl.jit``, kernels/common/jit_units.py) it makes them under the library's
recorder instead, then builds each distinct kernel once in a process of its own, side by side; where the dry run
fails it falls back to the calls themselves.
"""

from __future__ import annotations

from deltabench.harness.cases import Case
from deltabench.harness.registry import Impl

__all__ = ["compile_ahead"]


def compile_ahead(
    impl: Impl,
    cases: list[Case],
    *,
    workers: int | None = None,
) -> str:
    """Build what the gates of `cases` will call `impl` at; returns one line saying what was built and how.

    For an impl with a JIT family (``impl.jit``): a dry run of every case's gate calls lists the kernels, each
    distinct one is built in a worker process, up to `workers` at once.
    Otherwise, or when the dry run raises, the calls themselves, one after another (``verify.warm_calls``). A
    kernel that fails to build is named in the line, not raised: the gate makes that call and judges it."""
    from deltabench.correctness.engine import warm_calls

    fallback = ""
    if impl.jit:
        from deltabench.kernels.common.jit_units import build_side_by_side, distinct, family, first_line

        jit = family(impl.jit)
        try:
            with jit.recording() as recorded:
                for case in cases:
                    warm_calls(impl, case)
        except Exception as exc:
            fallback = f"dry run failed ({first_line(exc)}); "
        else:
            units = distinct(recorded)
            summary = build_side_by_side(jit.build, units, workers=workers)
            return f"{jit.name} dry run of {len(cases)} shapes: {summary.line()}"
    for case in cases:
        warm_calls(impl, case)
    return f"{fallback}{len(cases)} shapes called one after another"
