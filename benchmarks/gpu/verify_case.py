"""One ``verify_case`` on the GPU with its failures listed (a diagnostic for one shape, not a sweep).

    python benchmarks/gpu/verify_case.py IMPL SHAPE [DTYPE ...] [--seeds N]

e.g. ``triton_chunk B=1,T=64,H=2,K=128,V=128 bf16 fp32``: every gate regime, fwd+bwd where the impl has a
backward, with and without an initial state; one line per dtype and the first failures.
"""

from __future__ import annotations

import argparse
import time

from deltabench.harness.cases import Case, parse_shape
from deltabench.harness.registry import get_impl
from deltabench.harness.verify import verify_case


def main() -> None:
    """Verify IMPL at SHAPE for each DTYPE; print the worst check and the failures."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("impl")
    ap.add_argument("shape")
    ap.add_argument("dtypes", nargs="*", default=["bf16"])
    ap.add_argument("--op", default="gdn")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    impl = get_impl(args.op, args.impl)
    mode = "fwd+bwd" if impl.supports_backward else "fwd"
    for dtype in args.dtypes:
        case = Case(op=args.op, **parse_shape(args.shape, args.op), dtype=dtype, mode=mode, device=args.device)
        t0 = time.perf_counter()
        rep = verify_case(impl, case, seeds=args.seeds, extra_seed=True)
        bounded = [r for r in rep.records if r.threshold and r.value is not None]
        worst = max(bounded, key=lambda r: r.value / r.threshold)
        print(
            f"{'PASS' if rep.passed else 'FAIL'} {args.impl} {case.shape_id} {dtype} {time.perf_counter() - t0:.0f}s "
            f"worst {worst.check} {worst.value:.2e} / {worst.threshold:.0e}",
            flush=True,
        )
        for r in rep.failures[:6]:
            print(
                f"   failed: {r.check} {r.metric}={r.value} > {r.threshold} seed={r.seed} regime={r.regime} "
                f"h0={r.initial_state} ({r.reference})",
                flush=True,
            )


if __name__ == "__main__":
    main()
