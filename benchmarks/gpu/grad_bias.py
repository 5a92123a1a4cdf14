"""Each gradient's error against the gate's references, split in two, in one process (a diagnostic, not a gate).

The gate bounds a gradient's relative Frobenius error ``||x - r|| / ||r||``. This script also prints its component
along the reference, ``(x - r)·r / r·r``: the error of the gradient's scale, exactly 0.01 for a gradient scaled by
1.01, and near 0 for rounding noise that is not aligned with the gradient. It measures whether a check of that
component could catch the planted 1% scale (tests/harness/test_planted_bugs.py) while the Frobenius bound of the
bf16 `typical` regime rises above what bf16-intermediate kernels measure on the GPU (benchmarks/NOTES.md, Open
problems: FLA 0.6.0 9.55e-3 and triton_chunk 9.63e-3 against 9e-3 on the H200).

    python benchmarks/gpu/grad_bias.py [--op gdn] [--impls triton_chunk,fla_chunk] [--planted triton_chunk]
        [--shape B=1,T=8192,H=2,K=128,V=128] [--seeds 1] [--regimes typical] [--dtype bf16] [--device cuda]

Each impl is gated as `deltabench verify` gates it (every variant, reference and length of the case); `--planted
IMPL` adds IMPL with its k gradient scaled by 1.01. One line per gradient comparison over 4e-3, then each
(impl, gradient)'s worst of both numbers, then per gradient the honest impls' worst component against the planted
one's. Inputs are drawn on the device, so a GPU's numbers are not the CPU's.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("FLA_FLASH_QLA", "0")
os.environ.setdefault("FLA_TILELANG", "0")

import torch

# the planted gradient scale of the gate's own tests (tests/harness/grad_scale.py), as benchmarks/planted_factors.py
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "harness"))
from grad_scale import ScaleGrad

import deltabench.correctness.properties as properties
from deltabench.correctness.checks import along_reference
from deltabench.correctness.engine import verify_case
from deltabench.harness import Case, get_impl
from deltabench.harness.cases import parse_shape
from deltabench.harness.errors import BadInput

PLANTED_FACTOR = 1.01
SHOWN_ABOVE = 4e-3  # comparisons whose relative error is printed one by one


def planted(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` with its k gradient scaled by 1.01."""

    def call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *rest: Any, **kwargs: Any) -> Any:
        return fn(q, ScaleGrad.apply(k, PLANTED_FACTOR), v, *rest, **kwargs)

    return call


def measure(name: str, fn: Any, case: Case, seeds: int, regimes: tuple[str, ...]) -> list[tuple]:
    """Gate `fn` on `case`; one (name, regime, h0, reference, check, rel_fro, along) per gradient comparison.

    The gate's records carry the Frobenius error only, so its comparison function is wrapped for this call (a
    diagnostic must not add records to every stored document)."""
    rows: list[tuple] = []
    compare = properties.compare

    def recording(check: str, x: torch.Tensor, ref: torch.Tensor, **kw: Any) -> list:
        records = compare(check, x, ref, **kw)
        if check.startswith("grad:") and tuple(x.shape) == tuple(ref.shape):
            part = along_reference(x, ref)
            rows.append((name, kw["regime"], kw["initial_state"], kw["reference"], check, records[0].value, part))
        return records

    properties.compare = recording
    try:
        report = verify_case(fn, case, seeds=seeds, extra_seed=False, regimes=regimes)
    finally:
        properties.compare = compare
    failed = sorted({r.check for r in report.records if r.gating and not r.passed})
    print(f"{name}: {len(rows)} gradient comparisons, failed {', '.join(failed) or 'none'}", flush=True)
    return rows


def main() -> int:
    """Parse the arguments, gate every impl (and the planted one), print the two numbers of each comparison."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--op", default="gdn")
    p.add_argument("--impls", default="triton_chunk,fla_chunk")
    p.add_argument("--planted", default="triton_chunk", help="an impl run again with dk * 1.01 ('' for none)")
    p.add_argument("--shape", default="B=1,T=8192,H=2,K=128,V=128")
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--regimes", default="typical")
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args()
    try:
        case = Case(args.op, **parse_shape(args.shape, args.op), dtype=args.dtype, mode="fwd+bwd", device=args.device)
        names = [n for n in args.impls.split(",") if n]
        impls = {n: get_impl(args.op, n) for n in names}
        if args.planted:
            impls[f"{args.planted}*dk1.01"] = planted(get_impl(args.op, args.planted))
    except (BadInput, ValueError, KeyError) as exc:
        p.exit(2, f"grad_bias.py: {exc}\n")
    regimes = tuple(r for r in args.regimes.split(",") if r)
    rows = [row for name, fn in impls.items() for row in measure(name, fn, case, args.seeds, regimes)]
    for name, regime, h0, reference, check, rel, part in rows:
        if rel is not None and rel > SHOWN_ABOVE:
            print(f"  {name} {regime} h0={int(h0)} {check} rel_fro {rel:.2e} along {part:+.2e} | {reference}")
    worst: dict[tuple[str, str], list[float]] = {}
    for name, _regime, _h0, _ref, check, rel, part in rows:
        w = worst.setdefault((name, check), [0.0, 0.0])
        w[0], w[1] = max(w[0], rel or 0.0), max(w[1], abs(part))
    for (name, check), (rel, part) in sorted(worst.items()):
        print(f"worst {name} {check}: rel_fro {rel:.2e}, |along| {part:.2e}")
    planted_name = f"{args.planted}*dk1.01" if args.planted else None
    for check in sorted({c for _, c in worst}):
        honest = max((w[1] for (n, c), w in worst.items() if c == check and n != planted_name), default=0.0)
        bug = worst.get((planted_name, check), [0.0, 0.0])[1] if planted_name else 0.0
        print(f"{check}: honest |along| at most {honest:.2e}" + (f", planted {bug:.2e}" if planted_name else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
