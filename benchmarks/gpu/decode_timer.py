"""Try the decode timer (runners/decode_timer.py) on a GPU: per decode shape and impl, the CUDA-graph replay's
microseconds per call (scope call) beside a host-synchronised call's (scope host), and the state bandwidth.

    python benchmarks/gpu/decode_timer.py [--impl triton_decode --impl fla_recurrent ...]

Shapes: the decode-h200 suite's. Prints one line per (shape, impl); nothing is stored.
"""

from __future__ import annotations

import argparse

from deltabench.harness import get_impl
from deltabench.harness.ops import work
from deltabench.harness.suites import load_suite
from deltabench.runners.decode_timer import time_decode


def main() -> None:
    """Time every decode-h200 job's impl (or those given) with the decode timer and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impl", action="append", help="only these impls (repeatable)")
    args = parser.parse_args()
    print(f"{'shape':28} {'impl':18} {'graph us':>9} {'host us':>9} {'copies':>6} {'state GB/s':>10}")
    for case, name in load_suite("decode-h200").jobs(device="cuda"):
        if args.impl and name not in args.impl:
            continue
        impl = get_impl(case.op, name)
        why = impl.check_case(case)
        if why:
            print(f"{case.shape_id:28} {name:18} {why}")
            continue
        t = time_decode(impl, case)
        gbps = work(case.op, case.dims, case.dtype, "decode")["state_bytes"] / (t.graph_us * 1e-6) / 1e9
        print(f"{case.shape_id:28} {name:18} {t.graph_us:9.2f} {t.host_us:9.2f} {t.copies:6d} {gbps:10.0f}")


if __name__ == "__main__":
    main()
