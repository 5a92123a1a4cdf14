"""What the correctness gate costs per job: its wall time in a real run, and how many calls it makes.

    python benchmarks/cpu/gate_cost.py run SUITE [--impl NAME ...] [--op NAME ...] [--out FILE.json]
    python benchmarks/cpu/gate_cost.py calls OP IMPL SHAPE [--dtype fp32] [--mode fwd] [--reference auto]

``run`` runs the suite as ``deltabench run`` does (one worker process per impl) and prints, per job, the time from
its ``gate`` phase mark to the next mark (the parent sees the marks by polling the worker's log every 20 ms) and
how many of its verification records say they were reused. ``calls`` runs one job's gate in this process with the
suite defaults (3 seeds plus a drawn one, every regime) and counts the impl's calls and the oracle's, by shape.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path
from typing import Any


def _run(args: argparse.Namespace) -> int:
    from deltabench.harness.suites import load_suite
    from deltabench.runners.session import execution_order, plan_run, run_plan

    plan = plan_run(load_suite(args.suite), device="cpu", impls=args.impl or None, ops=args.op or None)
    marks: dict[str, list[tuple[str, float]]] = collections.defaultdict(list)

    def on_phase(job: Any, phase: str) -> None:
        marks[job.job_id].append((phase, time.perf_counter()))

    def on_done(job: Any, result: Any) -> None:
        marks[job.job_id].append(("done", time.perf_counter()))

    t0 = time.perf_counter()
    doc = run_plan(plan, on_phase=on_phase, on_done=on_done)
    wall = time.perf_counter() - t0
    rows = []
    by_id = {j.job_id: j for j in doc.jobs}
    for i in execution_order(plan):
        job = plan.jobs[i]
        seen = marks.get(job.job_id, [])
        gate = next((k for k, (p, _) in enumerate(seen) if p == "gate"), None)
        gate_s = seen[gate + 1][1] - seen[gate][1] if gate is not None and gate + 1 < len(seen) else None
        result = by_id[job.job_id]
        reused = sum("reused from job" in r.detail for r in result.verification)
        c = job.to_case()
        rows.append(
            {
                "job": f"{c.op} {job.impl} {c.shape_id} {c.dtype} {c.mode}",
                "status": result.status,
                "gate_s": gate_s,
                "records": len(result.verification),
                "reused": reused,
            }
        )
        shown = "-" if gate_s is None else f"{gate_s:6.2f}"
        print(f"{rows[-1]['job']:48s} {result.status:11s} gate {shown} s  records {len(result.verification):4d}"
              f"  reused {reused}")  # fmt: skip
    gates = sorted(r["gate_s"] for r in rows if r["gate_s"] is not None)
    if gates:
        median = gates[len(gates) // 2]
        print(f"jobs {len(rows)}, gated {len(gates)}: gate sum {sum(gates):.1f} s, median {median:.2f} s"
              f", max {gates[-1]:.2f} s; run wall {wall:.1f} s")  # fmt: skip
    if args.out:
        Path(args.out).write_text(json.dumps({"wall_s": wall, "jobs": rows, "meta": doc.meta}, indent=1))
    return 0


def _calls(args: argparse.Namespace) -> int:
    import torch

    from deltabench.correctness.engine import verify_case
    from deltabench.harness.cases import Case
    from deltabench.harness.ops import get_op
    from deltabench.harness.registry import get_impl

    dims = dict(kv.split("=") for kv in args.shape.split(","))
    case = Case(args.op, **{k: int(v) for k, v in dims.items()}, dtype=args.dtype, mode=args.mode)
    impl = get_impl(args.op, args.impl)
    spec = get_op(args.op)
    counts: collections.Counter[str] = collections.Counter()

    def shape_of(a: tuple) -> str:
        q = a[0]
        return "x".join(map(str, q.shape[:3])) if isinstance(q, torch.Tensor) else "?"

    def counted(*a: Any, **kw: Any) -> Any:
        counts[f"impl {shape_of(a)}"] += 1
        return impl(*a, **kw)

    for attr in ("name", "backend", "check_case", "supports_backward"):
        if hasattr(impl, attr):
            setattr(counted, attr, getattr(impl, attr))
    oracle = spec.oracle

    def counted_oracle(*a: Any, **kw: Any) -> Any:
        counts[f"oracle {shape_of(a)}"] += 1
        return oracle(*a, **kw)

    object.__setattr__(spec, "oracle", counted_oracle)
    t0 = time.perf_counter()
    report = verify_case(counted, case, reference=args.reference)
    took = time.perf_counter() - t0
    print(
        f"{case.shape_id} {case.dtype} {case.mode}: passed={report.passed}, {len(report.records)} records, {took:.1f} s"
    )
    for k, n in sorted(counts.items()):
        print(f"  {k} (BxTxH): {n}")
    print(f"  impl calls {sum(n for k, n in counts.items() if k.startswith('impl'))}, "
          f"oracle calls {sum(n for k, n in counts.items() if k.startswith('oracle'))}")  # fmt: skip
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run ``run`` or ``calls``."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("suite")
    r.add_argument("--impl", action="append")
    r.add_argument("--op", action="append")
    r.add_argument("--out")
    c = sub.add_parser("calls")
    c.add_argument("op")
    c.add_argument("impl")
    c.add_argument("shape", help="e.g. B=1,T=300,H=2,K=16,V=32")
    c.add_argument("--dtype", default="fp32")
    c.add_argument("--mode", default="fwd")
    c.add_argument("--reference", default="auto")
    args = p.parse_args(argv)
    return _run(args) if args.cmd == "run" else _calls(args)


if __name__ == "__main__":
    sys.exit(main())
