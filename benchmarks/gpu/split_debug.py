"""Stage-by-stage check and launch sweep of triton_chunk_split's forward on the GPU (a diagnostic, not a gate).

    python benchmarks/gpu/split_debug.py check B,T,H,D [--variant NAME] [--reps N]
    python benchmarks/gpu/split_debug.py sweep B,T,H,D

``check`` runs wy_fwd, then walk.py's ``state_walk`` and output.py's ``chunk_output`` `reps` times, each
followed by a device synchronisation (so an illegal memory access names its stage), and compares h, v_new,
the final state and o with chunk.py's ``state_fwd`` (the gated kernel, same arithmetic) on the same inputs,
with and without an initial state; then one fwd+bwd of the split autograd path against triton_chunk's.
A variant changes walk.LAUNCH / output.LAUNCH in this process first (one variant a process: a fault
poisons the CUDA context). ``sweep`` times each stage alone (do_bench median, L2 flushed) and each
(V block, warps, stages) of the walk and the output stage, checking each against ``state_fwd``'s result.
Prints one line per result; nothing is written.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
from deltabench.kernels.gdn import output, walk
from deltabench.kernels.gdn.chunk import chunk_gated_delta_rule
from deltabench.kernels.gdn.chunk_split import chunk_gated_delta_rule_split
from deltabench.kernels.gdn.local_bwd import local_bwd
from deltabench.kernels.gdn.output import chunk_output
from deltabench.kernels.gdn.state import state_bwd, state_fwd
from deltabench.kernels.gdn.walk import state_walk
from deltabench.kernels.gdn.wy import wy_fwd
from deltabench.references.gdn import make_inputs
from triton.testing import do_bench

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: a smoke run of `check` under TRITON_INTERPRET=1
VARIANTS = {
    "base": {},
    "out-w4": {"output": {"warps": 4}},
    "out-bv128": {"output": {"block_v": 128}},
    "walk-w4": {"walk": {"warps": 4}},
    "walk-s2": {"walk": {"stages": 2}},
}
WALK_CONFIGS = [(64, 8, 1), (16, 4, 1), (64, 4, 1), (16, 4, 2), (64, 8, 2), (64, 4, 2), (16, 4, 3), (16, 2, 2)]
OUTPUT_CONFIGS = [(64, 8, 1), (64, 4, 1), (128, 8, 1), (64, 4, 2), (128, 4, 1)]


def say(obj) -> None:
    """One line at once (the device returns the tail of stdout)."""
    print(obj if isinstance(obj, str) else json.dumps(obj), flush=True)


def sync() -> None:
    """Wait for the device (a fault surfaces here, at its stage)."""
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def inputs(shape: str, seed: int, h0: bool):
    """bf16 inputs as the library's entry point hands them to the kernels, plus wy_fwd's results."""
    B, T, H, D = (int(s) for s in shape.split(","))
    x = make_inputs(B, T, H, D, D, dtype=torch.bfloat16, device=DEVICE, seed=seed, initial_state=h0)
    q, k, v, beta = (x[n].contiguous() for n in ("q", "k", "v", "beta"))
    g = x["g"].float().contiguous()
    s0 = x["initial_state"].float().contiguous() if h0 else None
    _, w, u = wy_fwd(k, v, g, beta)
    return x, q, k, v, g, beta, s0, w, u, D**-0.5


def diff(a: torch.Tensor, ref: torch.Tensor) -> dict:
    """Non-finite count and relative max difference."""
    a, ref = a.float(), ref.float()
    bad = int((~torch.isfinite(a)).sum())
    rel = ((a - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item() if bad == 0 else float("inf")
    return {"nonfinite": bad, "rel_max": rel}


def check(shape: str, variant: str, reps: int, fwd_only: bool = False) -> int:
    """Stage by stage, synchronised; returns 1 on any fault, non-finite value or mismatch."""
    for mod, over in VARIANTS[variant].items():
        {"walk": walk.LAUNCH, "output": output.LAUNCH}[mod].update(over)
    bad = False
    for h0 in (False, True):
        _, q, k, _, g, _, s0, w, u, scale = inputs(shape, seed=1 + h0, h0=h0)
        o_ref, ht_ref, h_ref, vn_ref = state_fwd(q, k, w, u, g, scale, s0, True, True)
        sync()
        for rep in range(reps):
            stage = "walk"
            try:
                h, vn, ht = state_walk(k, w, u, g, s0, True)
                sync()
                stage = "output"
                o = chunk_output(q, k, g, h, vn, scale)
                sync()
            except Exception as e:  # report the faulting stage, then stop
                say({"shape": shape, "variant": variant, "h0": h0, "rep": rep, "fault": stage, "error": str(e)[:160]})
                return 1
            d = {
                n: diff(a, r)
                for n, a, r in (("h", h, h_ref), ("vnew", vn, vn_ref), ("ht", ht, ht_ref), ("o", o, o_ref))
            }
            ok = all(r["nonfinite"] == 0 and r["rel_max"] < 2e-2 for r in d.values())
            bad |= not ok
            if rep == 0 or not ok:
                say({"shape": shape, "variant": variant, "h0": h0, "rep": rep, "ok": ok, **d})
    if fwd_only:
        return 1 if bad else 0
    # the autograd path (the gate's fwd+bwd), against triton_chunk on the same inputs
    x, *_ = inputs(shape, seed=5, h0=False)
    do = torch.randn_like(x["v"])
    grads = {}
    for name, fn in (("split", chunk_gated_delta_rule_split), ("chunk", chunk_gated_delta_rule)):
        leaves = [x[n].detach().clone().requires_grad_(True) for n in ("q", "k", "v", "g", "beta")]
        try:
            o, _ = fn(*leaves)
            o.backward(do)
            sync()
        except Exception as e:
            say({"shape": shape, "variant": variant, "fwd+bwd": name, "error": str(e)[:160]})
            return 1
        grads[name] = [o.detach()] + [t.grad for t in leaves]
    d = {
        n: diff(a, r)
        for n, a, r in zip(("o", "dq", "dk", "dv", "dg", "dbeta"), grads["split"], grads["chunk"], strict=True)
    }
    ok = all(r["nonfinite"] == 0 and r["rel_max"] < 2e-2 for r in d.values())
    say({"shape": shape, "variant": variant, "fwd+bwd ok": ok, **d})
    return 0 if ok and not bad else 1


def ms(fn) -> float:
    """do_bench median."""
    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def sweep(shape: str) -> int:
    """Each stage alone, then each walk / output config (checked against state_fwd)."""
    _, q, k, v, g, beta, s0, w, u, scale = inputs(shape, seed=3, h0=True)
    o_ref, ht_ref, h_ref, vn_ref = state_fwd(q, k, w, u, g, scale, s0, True, True)
    L, *_ = wy_fwd(k, v, g, beta)
    do = torch.randn_like(v)
    dh, dvn, _ = state_bwd(q, k, w, g, do, None, scale)
    stages = {
        "wy_fwd": lambda: wy_fwd(k, v, g, beta),
        "state_fwd(fwd only)": lambda: state_fwd(q, k, w, u, g, scale, s0, True, False),
        "state_fwd(stores)": lambda: state_fwd(q, k, w, u, g, scale, s0, True, True),
        "state_bwd": lambda: state_bwd(q, k, w, g, do, None, scale),
        "local_bwd": lambda: local_bwd(q, k, v, g, beta, L, h_ref, dh, vn_ref, dvn, do, scale),
    }
    for name, fn in stages.items():
        say(f"stage {shape} {name:24s} {ms(fn):8.4f} ms")
    for cfg in WALK_CONFIGS:
        t0 = time.time()
        h, vn, ht = state_walk(k, w, u, g, s0, True, config=cfg)
        sync()
        d = {n: diff(a, r)["rel_max"] for n, a, r in (("h", h, h_ref), ("vnew", vn, vn_ref), ("ht", ht, ht_ref))}
        t = ms(lambda c=cfg: state_walk(k, w, u, g, s0, True, config=c))
        say(f"walk {shape} bv,warps,stages={cfg} {t:8.4f} ms err {max(d.values()):.1e} ({time.time() - t0:.0f}s)")
    for cfg in OUTPUT_CONFIGS:
        o = chunk_output(q, k, g, h_ref, vn_ref, scale, config=cfg)
        sync()
        err = diff(o, o_ref)["rel_max"]
        t = ms(lambda c=cfg: chunk_output(q, k, g, h_ref, vn_ref, scale, config=c))
        say(f"output {shape} bv,warps,stages={cfg} {t:8.4f} ms err {err:.1e}")
    return 0


def main() -> int:
    """check or sweep."""
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["check", "sweep"])
    ap.add_argument("shape", help="B,T,H,D")
    ap.add_argument("--variant", default="base", choices=sorted(VARIANTS))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--fwd-only", action="store_true", help="check: skip the fwd+bwd comparison")
    args = ap.parse_args()
    if args.mode == "check":
        return check(args.shape, args.variant, args.reps, args.fwd_only)
    return sweep(args.shape)


if __name__ == "__main__":
    sys.exit(main())
