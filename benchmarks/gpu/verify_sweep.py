"""``benchmarks/verify_sweep.sh`` for the GPU, in one process: every GPU impl x op x fp32/bf16 over 20 seeds.

Run on the GPU machine (a script, not a test)::

    python benchmarks/gpu/verify_sweep.py [--seeds 20] [--impl fla_chunk ...] [--op gdn ...] [--dtype bf16]

Each line is one ``verify_case`` (the runner's gate): ``--seeds`` consecutive seeds plus one drawn x the three
gate regimes (typical, long, strong) x with and without an initial state, the non-default scale, q and k off the
unit sphere, the input check and the length sweep, every gradient. Printed as the CPU sweep prints it (worst value
over its bound per check family; 1.00 is at the bound), so both tables read alike. One process keeps each
kernel's compiled code and the oracle's runs (the reference cache) between impls; shell-level sweeps pay FLA's
autotuning once per run. An impl that cannot take the small shape (e.g. K = V = 128 only) is verified at
``--wide-shape`` instead, and the line says which shape it ran.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

# deltabench's own torch and JAX impls are swept on the CPU (benchmarks/cpu/verify-sweep.txt); the GPU sweep
# covers the rest: its Triton kernels and every adapter.
CPU_SWEPT = ("torch_recurrent", "torch_chunk", "jax_chunk", "jax_scan")


def _family(check: str) -> str:
    return "grad" if check.startswith("grad") else check.split(":")[0]


def main() -> int:
    """Verify each GPU impl of each op at fp32 and bf16; print one line each; 1 if any failed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--shape", default="B=2,T=70,H=3,K=16,V=32")
    parser.add_argument("--wide-shape", default="B=2,T=70,H=3,K=128,V=128")
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--impl", action="append", help="impl names (default: all but the CPU-swept ones)")
    parser.add_argument("--op", action="append", help="ops (default: every op)")
    parser.add_argument("--dtype", action="append", choices=("fp32", "bf16"), help="dtypes (default: both)")
    args = parser.parse_args()

    from deltabench.harness.cases import Case, parse_shape
    from deltabench.harness.registry import all_impls
    from deltabench.harness.verify import verify_case

    failed = 0
    for impl in all_impls():
        wanted = impl.name in args.impl if args.impl else impl.name not in CPU_SWEPT
        if not wanted or (args.op and impl.op not in args.op) or impl.unavailable_reason(args.device):
            continue
        mode = "fwd+bwd" if impl.supports_backward else "fwd"
        for dtype in args.dtype or ("fp32", "bf16"):
            case = why = None
            for shape in (args.shape, args.wide_shape):
                case = Case(op=impl.op, **parse_shape(shape, impl.op), dtype=dtype, mode=mode, device=args.device)
                why = impl.check_case(case)
                if why is None:
                    break
            label = f"{impl.op} {impl.name} {dtype}"
            if why is not None:
                print(f"SKIP {label} {why}", flush=True)
                continue
            t0 = time.perf_counter()
            try:
                report = verify_case(impl, case, seeds=args.seeds, extra_seed=True)
            except Exception as exc:  # a crash fails the line and the sweep goes on
                failed += 1
                print(f"FAIL {label} {case.shape_id} raised {type(exc).__name__}: {exc}", flush=True)
                continue
            worst: dict[str, float] = {}
            for r in report.records:
                if r.metric == "rel_fro" and r.threshold:
                    v = math.inf if r.value is None else r.value / r.threshold
                    worst[_family(r.check)] = max(worst.get(_family(r.check), 0.0), v)
            failed += not report.passed
            families = " ".join(f"{k}={v:.2f}" for k, v in worst.items())
            print(
                f"{'PASS' if report.passed else 'FAIL'} {label} {case.shape_id} {time.perf_counter() - t0:.0f}s "
                f"{len(report.records)} records; worst/bound {families}",
                flush=True,
            )
            for r in report.failures[:3]:
                print(f"     failed: {r.check} {r.metric}={r.value} > {r.threshold} seed={r.seed}", flush=True)
    print(f"{failed} run(s) failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
