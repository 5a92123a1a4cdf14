"""Errors of every gdn gradient against the float64 oracle, at the gate's inputs, per impl, on the CPU at bf16.

Inputs, cotangents, variants (each regime without and with an initial state; with one, scale = 0.6 / sqrt(K);
the last regime's run without one draws q, k off the unit sphere) and the oracle are the gate's own
(correctness/verify.py). Triton impls run under the interpreter as patched by interp_bf16.py. Impls:
``triton_chunk``, ``torch_chunk`` (the registry's), ``fla`` (FLA 0.6.0's chunk_gated_delta_rule through
kernels/external/fla.py) and ``sites`` (triton_chunk's arithmetic with the sites of ``--off`` kept in fp32,
site_copy.py). One JSON line per (impl, seed, variant) on stdout.

    python benchmarks/cpu/bf16_vs_fla/grad_errors.py --shape 1,64,2,128,128 --seeds 0-4 \\
        --impls triton_chunk,fla,torch_chunk [--rounding rne|trunc] [--tf32] [--only strong,1] [--off L,WU]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, str(Path(__file__).resolve().parent))

import interp_bf16
import site_copy


def _seeds(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


def main() -> None:
    """Parse the arguments, run every impl on every (seed, variant) and print the errors."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", required=True, help="B,T,H,K,V")
    ap.add_argument("--seeds", default="0", help="e.g. 0-5 or 2,3")
    ap.add_argument("--impls", default="triton_chunk,fla,torch_chunk")
    ap.add_argument("--rounding", choices=("rne", "trunc"), default="rne", help="the interpreter's fp32->bf16 casts")
    ap.add_argument("--tf32", action="store_true", help="round fp32 dot operands that ask for tf32 (GPU products)")
    ap.add_argument("--only", help="one variant: REGIME,H0 (e.g. strong,1)")
    ap.add_argument("--off", default="", help="sites kept in fp32 by the 'sites' impl (site_copy.SITES)")
    ap.add_argument("--dtype", default="bf16")
    args = ap.parse_args()
    interp_bf16.install(args.rounding, args.tf32)

    import torch  # noqa: F401  (after the interpreter is set up)
    import triton.language as tl

    from deltabench.correctness import calls, oracle, plan
    from deltabench.correctness.checks import rel_fro
    from deltabench.harness.cases import Case
    from deltabench.harness.ops import get_op
    from deltabench.harness.registry import get_impl

    off = {s for s in args.off.split(",") if s}
    B, T, H, K, V = (int(x) for x in args.shape.split(","))
    case = Case(op="gdn", B=B, T=T, H=H, K=K, V=V, dtype=args.dtype, mode="fwd+bwd")
    spec = get_op("gdn")
    fns = {}
    for name in args.impls.split(","):
        if name == "fla":
            from deltabench.kernels.external.fla import gdn_fla_chunk

            fns[name] = gdn_fla_chunk
        elif name == "sites":
            chunk = site_copy.build(off)
            fns[name] = site_copy.gdn_sites(chunk)
        else:
            fns[name] = get_impl("gdn", name)
    if args.tf32:
        # Every tl.dot then sees the precision it asks the GPU for (the patched interpreter widens 16-bit
        # operands itself, which is all kernels/common/triton/mma.py's interpreter branch does).
        import deltabench.kernels.common.triton.mma as mma

        mma.INTERPRETED = tl.constexpr(False)
        if "gdn_sites.common.triton.mma" in sys.modules:
            sys.modules["gdn_sites.common.triton.mma"].INTERPRETED = tl.constexpr(False)
    rounding = args.rounding + ("+tf32" if args.tf32 else "")
    for seed in _seeds(args.seeds):
        for variant in plan.gate_variants(spec, spec.regimes):
            if args.only and args.only != f"{variant.regime},{int(variant.h0)}":
                continue
            items = {}
            for name, fn in fns.items():
                t0 = time.time()
                items[name] = (calls.run_impl(fn, spec, case, variant, seed=seed, grads=True), time.time() - t0)
            first = next(iter(items.values()))[0]
            ref = oracle.oracle_runs(spec, [first], plan.ORACLE_MAX_ELEMENTS_GRAD)[0]
            for name, (item, secs) in items.items():
                errs = {"o": rel_fro(item.run.o, ref.o), "state": rel_fro(item.run.state, ref.state)}
                for g, r in ref.grads.items():
                    if r is not None and item.run.grads.get(g) is not None:
                        errs[g] = rel_fro(item.run.grads[g], r)
                row = {"impl": name, "round": rounding, "shape": case.shape_id, "seed": seed}
                row |= {"regime": variant.regime, "h0": variant.h0, "unit_qk": variant.unit_qk, "secs": round(secs, 1)}
                row |= {"sites_off": ",".join(sorted(off)) if name == "sites" else "", "err": errs}
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
