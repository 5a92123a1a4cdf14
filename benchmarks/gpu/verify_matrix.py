"""The correctness gate for deltabench's Triton GDN kernels over a matrix of awkward cases, in one process.

Run on the GPU (a script, not a test)::

    python benchmarks/gpu/verify_matrix.py [--device cuda] [--impl triton_chunk ...]

For each impl, dtype (bf16, fp32), shape (T = 1, 63, 65, 1000; H = 3; K != V; K = V = 256) and gate regime, it
runs ``verify_case`` (with and without an initial state, one fixed seed and one drawn, gradients where the
impl has a backward) and prints one line per case: PASS/FAIL, the number of gating records, and the check
closest to its bound. Exit 1 if any case fails. One process keeps Triton's compiled kernels between cases.
"""

from __future__ import annotations

import argparse
import sys
import time

SHAPES = (
    "B=1,T=1,H=3,K=128,V=64",
    "B=2,T=63,H=3,K=64,V=128",
    "B=2,T=65,H=3,K=128,V=128",
    "B=1,T=1000,H=3,K=128,V=64",
    "B=1,T=1000,H=2,K=256,V=256",
)


def main() -> int:
    """Verify every (impl, dtype, shape, regime) of the matrix; print a line each; 1 if any failed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--impl", action="append", help="impls (default: triton_chunk, triton_recurrent)")
    parser.add_argument("--dtype", action="append", help="dtypes (default: bf16, fp32)")
    args = parser.parse_args()

    from deltabench.correctness.engine import verify_case
    from deltabench.harness.cases import Case, parse_shape
    from deltabench.harness.registry import get_impl

    failed = 0
    for name in args.impl or ("triton_chunk", "triton_recurrent"):
        impl = get_impl("gdn", name)
        mode = "fwd+bwd" if impl.supports_backward else "fwd"
        for dtype in args.dtype or ("bf16", "fp32"):
            for shape in SHAPES:
                for regime in ("typical", "long"):
                    case = Case(op="gdn", **parse_shape(shape), dtype=dtype, regime=regime, mode=mode,
                                device=args.device)  # fmt: skip
                    why = impl.check_case(case)
                    if why:
                        print(f"SKIP {name:16s} {case.shape_id:24s} {dtype} {regime:7s} {why}")
                        continue
                    label = f"{name:16s} {case.shape_id:24s} {dtype} {regime:7s}"
                    t0 = time.perf_counter()
                    try:
                        report = verify_case(impl, case, seeds=1, extra_seed=True)
                    except Exception as exc:  # a crash is a failure of the case, reported, not the end
                        failed += 1
                        print(f"FAIL {label} raised {type(exc).__name__}: {exc}")
                        continue
                    gating = [r for r in report.records if r.gating and r.value is not None and r.threshold]
                    worst = max(gating, key=lambda r: r.value / r.threshold, default=None)
                    closest = (
                        f"{worst.check} {worst.metric}={worst.value:.2e} (bound {worst.threshold:.0e})" if worst else ""
                    )
                    verdict = "PASS" if report.passed else "FAIL"
                    failed += not report.passed
                    print(
                        f"{verdict} {label} {len(report.records):4d} records {time.perf_counter() - t0:5.1f}s"
                        f"  closest: {closest}",
                        flush=True,
                    )
                    for r in report.failures[:3]:
                        print(f"     failed: {r.check} {r.metric}={r.value} > {r.threshold} seed={r.seed}")
    print(f"{failed} case(s) failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
