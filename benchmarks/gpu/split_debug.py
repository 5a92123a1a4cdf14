"""Stage-by-stage check and launch sweep of triton_chunk_split's forward on the GPU (a diagnostic, not a gate).

    python benchmarks/gpu/split_debug.py check B,T,H,D [--variant NAME] [--reps N]
    python benchmarks/gpu/split_debug.py tune B,T,H,D --kernel wy|walk|output|state_bwd|local_bwd [--skip N]

``check`` runs wy_fwd, then walk.py's ``state_walk`` and output.py's ``chunk_output`` `reps` times, each
followed by a device synchronisation (so an illegal memory access names its stage), and compares h, v_new,
the final state and o with chunk.py's ``state_fwd`` (the gated kernel, same arithmetic) on the same inputs,
with and without an initial state; then one fwd+bwd of the split autograd path against triton_chunk's.
A variant changes walk.LAUNCH / output.LAUNCH in this process first (one variant a process: a fault
poisons the CUDA context). ``tune`` times each launch config of one kernel (do_bench median, L2 flushed),
checking its results against the first config's (the one the gated library used).
Prints one line per result; nothing is written.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
from triton.testing import do_bench

from deltabench.kernels.gdn.triton import output, walk
from deltabench.kernels.gdn.triton.chunk import chunk_gated_delta_rule
from deltabench.kernels.gdn.triton.chunk_split import chunk_gated_delta_rule_split
from deltabench.kernels.gdn.triton.local_bwd import local_bwd
from deltabench.kernels.gdn.triton.output import chunk_output
from deltabench.kernels.gdn.triton.state import state_bwd, state_fwd
from deltabench.kernels.gdn.triton.walk import state_walk
from deltabench.kernels.gdn.triton.wy import wy_fwd
from deltabench.references.gdn import make_inputs

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: a smoke run of `check` under TRITON_INTERPRET=1
VARIANTS = {
    "base": {},
    "out-w4": {"output": {"warps": 4}},
    "out-bv128": {"output": {"block_v": 128}},
    "walk-w4": {"walk": {"warps": 4}},
    "walk-s2": {"walk": {"stages": 2}},
}


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


TUNE = {  # kernel: configs, the first the reference (the launch the gated library used before this sweep)
    "wy": [(4, 1), (2, 1), (8, 1), (4, 2), (2, 2), (8, 2)],
    "walk": [(64, 8, 1), (16, 4, 2), (16, 2, 2), (64, 4, 2), (64, 8, 2), (16, 4, 3), (16, 2, 3), (32, 4, 2)],
    "walk16": [(16, 4, 2), (16, 2, 2), (16, 4, 3), (16, 2, 3), (16, 8, 2), (64, 4, 2), (64, 8, 2)],
    "output": [(64, 8, 1), (128, 4, 1), (128, 4, 2), (64, 4, 1), (128, 8, 1), (64, 2, 1)],
    "state_bwd": [(64, 8, 1), (16, 4, 2), (16, 2, 2), (64, 4, 2), (64, 8, 2), (16, 4, 3), (32, 4, 2)],
    "local_bwd": [(64, 8, 1), (64, 4, 1), (64, 8, 2), (128, 8, 1), (32, 8, 1), (32, 4, 1), (64, 4, 2)],
    "local_bwd2": [(64, 8, 2, False), (64, 8, 2, True), (64, 4, 2, True), (64, 8, 1, True), (64, 4, 1, True)],
}


def tune(kernel: str, shape: str, skip: int, compile_only: bool = False) -> int:
    """Time each config of `kernel` (from index `skip`), checking its results against the first config's.

    Prints ``try`` before each launch, so that a driver can restart after a config that faults."""
    _, q, k, v, g, beta, s0, w, u, scale = inputs(shape, seed=3, h0=True)
    L, _, _ = wy_fwd(k, v, g, beta)
    _, _, h, vn = state_fwd(q, k, w, u, g, scale, s0, True, True)
    do = torch.randn_like(v)
    dh, dvn, _ = state_bwd(q, k, w, g, do, None, scale)
    fns = {
        "wy": lambda c: wy_fwd(k, v, g, beta, config=c),
        "walk": lambda c: state_walk(k, w, u, g, s0, True, config=c),
        "walk16": lambda c: state_walk(k, w, u, g, s0, True, config=c),
        "output": lambda c: (chunk_output(q, k, g, h, vn, scale, config=c),),
        "state_bwd": lambda c: state_bwd(q, k, w, g, do, None, scale, config=c),
        "local_bwd": lambda c: local_bwd(q, k, v, g, beta, L, h, dh, vn, dvn, do, scale, config=c),
        "local_bwd2": lambda c: local_bwd(q, k, v, g, beta, L, h, dh, vn, dvn, do, scale, config=c),
    }
    fn = fns[kernel]
    ref = fn(TUNE[kernel][0])
    sync()
    for i, cfg in enumerate(TUNE[kernel]):
        if i < skip:
            continue
        say(f"try {kernel} {shape} {i}")
        got = fn(cfg)
        sync()
        errs = [diff(a, r) for a, r in zip(got, ref, strict=True) if a is not None]
        err = max(e["rel_max"] for e in errs)
        if compile_only:
            say(f"compiled {kernel} {shape} cfg={cfg} err {err:.1e}")
            continue
        t = ms(lambda c=cfg: fn(c))
        say(f"tune {kernel} {shape} cfg={cfg} {t:8.4f} ms err {err:.1e}")
    return 0


def main() -> int:
    """check or sweep."""
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["check", "tune"])
    ap.add_argument("shape", help="B,T,H,D")
    ap.add_argument("--kernel", choices=sorted(TUNE), help="tune: which kernel")
    ap.add_argument("--skip", type=int, default=0, help="tune: start at this config index")
    ap.add_argument("--compile-only", action="store_true", help="tune: launch and check each config, no timing")
    ap.add_argument("--variant", default="base", choices=sorted(VARIANTS))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--fwd-only", action="store_true", help="check: skip the fwd+bwd comparison")
    args = ap.parse_args()
    if args.mode == "check":
        return check(args.shape, args.variant, args.reps, args.fwd_only)
    return tune(args.kernel, args.shape, args.skip, args.compile_only)


if __name__ == "__main__":
    sys.exit(main())
