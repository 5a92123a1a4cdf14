"""Measurement quality of deltabench's CUDA timer, on a GPU (a script, not a test).

Two questions, per impl, shape and mode:

1. Repeatability: five repeated timings of the same case (fresh timer state each time) give medians
   within 1% of each other for kernels of 0.5 ms or more.
2. Agreement: the harness's median agrees with ``triton.testing.do_bench`` (median, L2 flushed) on the
   same closure within 3%.

Usage (on the GPU machine)::

    python benchmarks/measurement_quality.py [--impl fla_chunk --impl triton_chunk] [--repeats 5]

Prints a markdown table and, when ``$OUT`` is set, writes it to ``$OUT/measurement_quality.md`` with the
raw figures in ``$OUT/measurement_quality.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

DEFAULT_IMPLS = ("fla_chunk", "flash_qla", "triton_chunk", "torch_chunk")
DEFAULT_SHAPES = ("B=8,T=4096,H=6,K=128,V=128", "B=4,T=8192,H=16,K=128,V=128")
REPEAT_BOUND = 0.01  # medians within 1% of each other ...
REPEAT_MIN_MS = 0.5  # ... for kernels of at least 0.5 ms
DO_BENCH_BOUND = 0.03  # harness vs do_bench within 3%


def _measure(impl_name: str, shape: str, mode: str, args: argparse.Namespace) -> dict:
    import torch
    import triton.testing

    from deltabench.harness.cases import Case, parse_shape
    from deltabench.harness.ops import get_op
    from deltabench.harness.registry import get_impl
    from deltabench.runners import cuda
    from deltabench.runners.closures import build_subject

    case = Case(op="gdn", **parse_shape(shape), dtype="bf16", mode=mode, device="cuda")
    impl = get_impl("gdn", impl_name)
    why = impl.check_case(case)
    if why:
        return {"impl": impl_name, "shape": shape, "mode": mode, "skipped": why}
    inputs = get_op("gdn").make_inputs(
        case.B, case.T, case.H, case.K, case.V, dtype=case.torch_dtype, device="cuda", seed=0
    )
    subject = build_subject(impl, case, inputs)
    subject()  # compile and autotune before anything is timed
    torch.cuda.synchronize()
    # min_reps=10: the setting the published figures were measured with (the shared default is 5).
    runs = [
        cuda.time_callable(subject, budget_s=args.budget_s, cuda_graph=args.cuda_graph, min_reps=10)
        for _ in range(args.repeats)
    ]
    medians = [r.median_ms for r in runs]
    spread = (max(medians) - min(medians)) / min(medians)
    ref = float(
        triton.testing.do_bench(subject, warmup=100, rep=max(200, int(args.budget_s * 1000)), return_mode="median")
    )
    ours = statistics.median(medians)
    diff = (ours - ref) / ref
    return {
        "impl": impl_name,
        "shape": shape,
        "mode": mode,
        "medians_ms": medians,
        "samples": [len(r.samples_ms) for r in runs],
        "stop_reasons": [r.stop_reason for r in runs],
        "sem_rel": [r.sem_rel for r in runs],
        "spread": spread,
        "repeat_ok": spread <= REPEAT_BOUND if ours >= REPEAT_MIN_MS else None,
        "do_bench_ms": ref,
        "harness_ms": ours,
        "diff": diff,
        "do_bench_ok": abs(diff) <= DO_BENCH_BOUND,
    }


def _table(rows: list[dict], clock: str) -> str:
    out = [
        f"| impl | shape | mode | medians ms ({clock}, x{len(rows[0].get('medians_ms', [])) or '-'}) "
        "| spread | within 1% | do_bench ms | harness vs do_bench | within 3% |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "skipped" in r:
            out.append(f"| {r['impl']} | {r['shape']} | {r['mode']} | skipped: {r['skipped']} | | | | | |")
            continue
        ok = {True: "yes", False: "NO", None: "n/a (< 0.5 ms)"}[r["repeat_ok"]]
        meds = ", ".join(f"{m:.4f}" for m in r["medians_ms"])
        out.append(
            f"| {r['impl']} | {r['shape']} | {r['mode']} | {meds} | {r['spread']:.2%} | {ok} | "
            f"{r['do_bench_ms']:.4f} | {r['diff']:+.2%} | {'yes' if r['do_bench_ok'] else 'NO'} |"
        )
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Measure, print the table, write it under $OUT; exit 1 when a bound is missed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impl", action="append", help=f"impls to measure (default: {', '.join(DEFAULT_IMPLS)})")
    parser.add_argument("--shape", action="append", help="shapes (default: the train shapes)")
    parser.add_argument("--mode", action="append", choices=("fwd", "fwd+bwd", "bwd"))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--budget-s", type=float, default=2.0, help="timing budget per repeat")
    parser.add_argument("--cuda-graph", action="store_true", help="time CUDA-graph replays instead of events")
    args = parser.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("measurement_quality: needs a CUDA device", file=sys.stderr)
        return 2
    rows = []
    for impl in args.impl or DEFAULT_IMPLS:
        for shape in args.shape or DEFAULT_SHAPES:
            for mode in args.mode or ("fwd", "fwd+bwd"):
                try:
                    rows.append(_measure(impl, shape, mode, args))
                except Exception as exc:  # one impl's failure must not hide the others' figures
                    rows.append({"impl": impl, "shape": shape, "mode": mode, "skipped": f"{type(exc).__name__}: {exc}"})
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    clock = "CUDA graph" if args.cuda_graph else "CUDA events"
    header = f"Measurement quality on {torch.cuda.get_device_name(0)} (torch {torch.__version__}), bf16, L2 flushed\n\n"
    text = header + _table(rows, clock)
    print(text)
    if os.environ.get("OUT"):
        out = Path(os.environ["OUT"])
        out.mkdir(parents=True, exist_ok=True)
        (out / "measurement_quality.md").write_text(text)
        (out / "measurement_quality.json").write_text(json.dumps(rows, indent=1))
    missed = [r for r in rows if r.get("repeat_ok") is False or r.get("do_bench_ok") is False]
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
