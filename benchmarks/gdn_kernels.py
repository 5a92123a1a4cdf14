"""Development bench for deltabench's Triton GDN kernels: gate on the GPU, then time beside FLA's Triton path.

One call does a whole cycle (the device is lent in short leases):

1. gate: our chunked fwd+bwd and fused recurrent fwd against the float64 oracle (on the GPU) at awkward
   shapes (T = 1, 63, 65, 1000; H = 3; K != V) and at the target shapes with a reduced T, bf16 and fp32,
   both regimes, with and without initial state, random cotangents on o and the final state;
2. time (bf16, triton.testing.do_bench median, L2 flushed): ours vs FLA 0.6.0's Triton path
   (``FLA_FLASH_QLA=0``; its Hopper guard for the gated backward, FLA #640, bypassed: our gate does not
   judge FLA, the timing only needs it to run), fwd and fwd+bwd, with peak memory of fwd+bwd;
3. optional launch variants (``--variants``), each gated at a small shape before it is timed.

Free of the harness (no pydantic on the device image). Usage::

    python benchmarks/gdn_kernels.py [--out DIR] [--skip-gate] [--skip-fla] [--variants]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback

os.environ.setdefault("FLA_FLASH_QLA", "0")

import torch
import triton
from deltabench.kernels.gdn import local_bwd, state, wy
from deltabench.kernels.gdn.chunk import chunk_gated_delta_rule
from deltabench.kernels.gdn.fused_recurrent import fused_recurrent_gated_delta_rule
from deltabench.references.gdn import gdn_recurrent, make_inputs
from triton.testing import do_bench

TARGETS = [(8, 4096, 6, 128), (4, 8192, 16, 128), (1, 32768, 16, 128), (1, 1024, 6, 128)]
# the harness's bf16 / fp32 thresholds (harness/tolerances.py), relative Frobenius error
BOUNDS = {torch.bfloat16: {"o": 1e-2, "ht": 1e-2, "grad": 8e-3}, torch.float32: {"o": 1e-4, "ht": 1e-4, "grad": 1e-4}}
LOG: list[dict] = []
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: a smoke run under TRITON_INTERPRET=1


def say(msg: str) -> None:
    """Print at once (the device returns the tail of stdout)."""
    print(msg, flush=True)


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative Frobenius error; NaN anywhere gives inf."""
    x = x.double()
    if not torch.isfinite(x).all():
        return float("inf")
    return ((x - ref).norm() / ref.norm().clamp_min(1e-300)).item()


def gate_case(B, T, H, K, V, dtype, regime, h0, seed=0) -> dict:
    """Our chunked fwd+bwd and recurrent fwd vs the float64 oracle at one case."""
    x = make_inputs(B, T, H, K, V, dtype=dtype, device=DEVICE, seed=seed, regime=regime, initial_state=h0)
    ours = {n: t.clone().requires_grad_(True) for n, t in x.items()}
    ref = {n: t.double().clone().requires_grad_(True) for n, t in x.items()}
    gen = torch.Generator(device=DEVICE).manual_seed(seed + 1)
    do = torch.randn(B, T, H, V, device=DEVICE, generator=gen).to(dtype)
    dht = torch.randn(B, H, K, V, device=DEVICE, generator=gen) * 0.1
    o, ht = chunk_gated_delta_rule(
        ours["q"], ours["k"], ours["v"], ours["g"], ours["beta"], initial_state=ours.get("initial_state")
    )
    (o.float() * do.float()).sum().add((ht * dht).sum()).backward()
    ro, rht = gdn_recurrent(ref["q"], ref["k"], ref["v"], ref["g"], ref["beta"], initial_state=ref.get("initial_state"))
    (ro * do.double()).sum().add((rht * dht.double()).sum()).backward()
    with torch.no_grad():
        fo, fht = fused_recurrent_gated_delta_rule(
            x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x.get("initial_state")
        )
    errs = {"o": rel_err(o, ro), "ht": rel_err(ht, rht), "rec_o": rel_err(fo, ro), "rec_ht": rel_err(fht, rht)}
    for n in ours:
        errs["d" + n] = rel_err(ours[n].grad, ref[n].grad)
    bound = BOUNDS[dtype]
    fails = [
        n
        for n, e in errs.items()
        if e > (bound["grad"] if n.startswith("d") else bound["o"] if "o" in n else bound["ht"])
    ]
    return {"errs": errs, "fails": fails}


def run_gate(cases) -> bool:
    """Gate every case; print one line each; True when all pass."""
    ok = True
    for B, T, H, K, V, dtype, regime, h0 in cases:
        t0 = time.time()
        try:
            r = gate_case(B, T, H, K, V, dtype, regime, h0)
        except Exception as e:
            frames = [f"{os.path.basename(f.filename)}:{f.lineno}" for f in traceback.extract_tb(e.__traceback__)]
            say(f"crash in {' <- '.join(reversed(frames[-4:]))}")
            r = {
                "errs": {"o": float("inf"), "dk": float("inf")},
                "fails": [f"crash {type(e).__name__}: {str(e)[:200]}"],
            }
        ok &= not r["fails"]
        name = f"B{B}-T{T}-H{H}-K{K}-V{V}-{str(dtype)[6:]}-{regime}-h0{int(h0)}"
        worst = max(r["errs"].items(), key=lambda kv: kv[1])
        verdict = "PASS" if not r["fails"] else "FAIL " + ",".join(r["fails"])
        errs = f"worst {worst[0]}={worst[1]:.1e} o={r['errs']['o']:.1e} dk={r['errs']['dk']:.1e}"
        say(f"gate {name:42s} {verdict} {errs} ({time.time() - t0:.1f}s)")
        LOG.append({"gate": name, **r})
    return ok


def fla_fns():
    """FLA's chunked and recurrent GDN with the Hopper backward guard bypassed, or None if FLA is missing."""
    try:
        import fla.ops.common.chunk_o as fla_chunk_o
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_chunk
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule as fla_rec
    except Exception as e:
        say(f"FLA unavailable: {e!r}")
        return None
    fla_chunk_o.TRITON_ABOVE_3_4_0 = False  # bypass FLA #640's guard (raises on Hopper with Triton 3.4-3.7.0)
    return fla_chunk, fla_rec


def bench_ms(fn, grad_to_none=None) -> float:
    """Median ms of `fn` (do_bench flushes L2 between calls)."""
    return do_bench(fn, warmup=25, rep=100, grad_to_none=grad_to_none, return_mode="median")


def peak_mib(fn) -> float:
    """Peak allocated MiB while `fn` runs, counting what was allocated before (inputs)."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() / 2**20


def time_impl(label, chunk_fn, x, do, recurrent_fn=None) -> dict:
    """fwd, fwd+bwd and peak memory of one impl at one shape."""
    q, k, v, g, beta = (x[n] for n in ("q", "k", "v", "g", "beta"))
    res = {}
    with torch.no_grad():
        res["fwd"] = bench_ms(lambda: chunk_fn(q, k, v, g, beta, output_final_state=True))
        if recurrent_fn is not None:
            res["rec_fwd"] = bench_ms(lambda: recurrent_fn(q, k, v, g=g, beta=beta, output_final_state=True))
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v, g, beta)]

    def fwd_bwd():
        o, _ = chunk_fn(*leaves, output_final_state=True)
        o.backward(do)

    res["fwd+bwd"] = bench_ms(fwd_bwd, grad_to_none=leaves)
    for t in leaves:
        t.grad = None
    res["peak_mib"] = peak_mib(fwd_bwd)
    return res


def run_timing(fla, shapes, tag="v0") -> list[dict]:
    """Time ours (and FLA when given) at `shapes`, printing a row per shape."""
    rows = []
    for B, T, H, D in shapes:
        x = make_inputs(B, T, H, D, D, dtype=torch.bfloat16, device="cuda", seed=0)
        do = torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16)
        row = {"tag": tag, "shape": (B, T, H, D)}

        def ours_rec(q, k, v, g, beta, output_final_state):
            return fused_recurrent_gated_delta_rule(q, k, v, g, beta, output_final_state=output_final_state)

        with_rec = T * B <= 32768
        row["ours"] = time_impl("ours", chunk_gated_delta_rule, x, do, ours_rec if with_rec else None)
        if fla is not None:
            fla_chunk, fla_rec = fla
            row["fla"] = time_impl("fla", fla_chunk, x, do, fla_rec if with_rec and tag == "v0" else None)
        rows.append(row)
        LOG.append({"timing": row})
        o, f = row["ours"], row.get("fla", {})
        line = f"time {tag} {B},{T},{H},{D}: ours fwd {o['fwd']:.3f} fb {o['fwd+bwd']:.3f} ms {o['peak_mib']:.0f} MiB"
        if f:
            line += (f" | fla fwd {f['fwd']:.3f} fb {f['fwd+bwd']:.3f} ms {f['peak_mib']:.0f} MiB"
                     f" | speedup fwd {f['fwd'] / o['fwd']:.2f}x fb {f['fwd+bwd'] / o['fwd+bwd']:.2f}x")  # fmt: skip
        if "rec_fwd" in o:
            line += f" | rec ours {o['rec_fwd']:.3f}" + (f" fla {f['rec_fwd']:.3f}" if "rec_fwd" in f else "")
        say(line)
        del x, do
        torch.cuda.empty_cache()
    return rows


def kernel_resources() -> None:
    """Registers and spills of every compiled variant of our kernels (best effort across Triton versions)."""
    kernels = {
        "wy_fwd": wy.wy_fwd_kernel,
        "state_fwd": state.state_fwd_kernel,
        "state_bwd": state.state_bwd_kernel,
        "local_bwd": local_bwd.local_bwd_kernel,
    }
    for name, fn in kernels.items():
        try:
            for cache in fn.device_caches.values():
                for compiled in cache[0].values():
                    meta = compiled.metadata
                    say(f"kernel {name}: regs {compiled.n_regs} spills {compiled.n_spills} warps {meta.num_warps}")
        except Exception as e:
            say(f"kernel {name}: resources unavailable ({e!r})")


VARIANTS = {
    "v1-seq-bv32-w4": lambda: state.LAUNCH.update(min_programs=10**9, warps=4),
    "v2-seq-bv64-w4": lambda: state.LAUNCH.update(min_programs=0, warps=4),
    "v3-localbwd-w4": lambda: local_bwd.LAUNCH.update(warps=4),
}


def main() -> int:
    """Gate, time, write the log; exit 1 when the gate fails."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--skip-gate", action="store_true")
    ap.add_argument("--skip-fla", action="store_true")
    ap.add_argument("--variants", action="store_true")
    ap.add_argument("--gate-only", choices=["full", "quick", "t1"], help="(internal) run the gate in this process")
    ap.add_argument("--gate", default="full", choices=["full", "quick"], help="which gate the child runs")
    ap.add_argument("--shapes", type=int, default=len(TARGETS), help="time only the first N target shapes")
    ap.add_argument("--stages", type=int, help="override the sequential stages' num_stages")
    args = ap.parse_args()
    if args.stages is not None:
        state.LAUNCH["stages"] = args.stages
    if args.gate_only == "t1":
        return 0 if run_gate([(2, 1, 3, 64, 128, torch.bfloat16, "typical", False)]) else 1
    if args.gate_only == "quick":  # a short lease: few compiled variants
        bf = torch.bfloat16
        cases = [(2, T, 3, 64, 128, bf, r, True) for T in (1, 65, 1000) for r in ("typical", "long")]
        cases += [(8, 256, 6, 128, 128, bf, "typical", False)]
        return 0 if run_gate(cases) else 1
    say(f"torch {torch.__version__} triton {triton.__version__} {torch.cuda.get_device_name()}")
    ok = True
    if not args.skip_gate and args.gate_only is None:
        # in a child process: an illegal memory access would poison this process's CUDA context
        extra = [] if args.stages is None else ["--stages", str(args.stages)]
        ok = subprocess.run([sys.executable, __file__, "--gate-only", args.gate, *extra]).returncode == 0
        say(f"gate child {'PASSED' if ok else 'FAILED'}")
    if args.gate_only == "full":
        t0 = time.time()
        cases = []
        for dtype in (torch.bfloat16, torch.float32):
            for regime in ("typical", "long"):
                for h0 in (False, True):
                    for T in (1, 63, 65, 1000) if dtype == torch.bfloat16 else (1, 65, 1000):
                        cases.append((2, T, 3, 64, 128, dtype, regime, h0))
            cases.append((1, 200, 3, 128, 64, dtype, "long", True))
            cases.append((1, 130, 2, 256, 256, dtype, "typical", True))
            cases.append((8, 256, 6, 128, 128, dtype, "typical", True))
            cases.append((1, 1024, 6, 128, 128, dtype, "long", False))
        ok = run_gate(cases)
        say(f"gate {'PASSED' if ok else 'FAILED'} ({len(cases)} cases, {time.time() - t0:.0f}s)")
        return 0 if ok else 1
    fla = None if args.skip_fla else fla_fns()
    t0 = time.time()
    run_timing(fla, TARGETS[: args.shapes])
    say(f"timing done ({time.time() - t0:.0f}s)")
    kernel_resources()
    if args.variants:
        base = (dict(state.LAUNCH), dict(local_bwd.LAUNCH))
        for tag, apply in VARIANTS.items():
            state.LAUNCH.update(base[0])
            local_bwd.LAUNCH.update(base[1])
            apply()
            vok = run_gate([(2, 130, 3, 128, 128, torch.bfloat16, "long", True)])
            if vok:
                run_timing(None, TARGETS[:3], tag=tag)
        state.LAUNCH.update(base[0])
        local_bwd.LAUNCH.update(base[1])
    with open(os.path.join(args.out, "gdn_kernels.json"), "w") as f:
        json.dump(LOG, f, indent=1, default=str)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
