"""Development bench for deltabench's Triton GDN kernels: gate on the GPU, then time beside FLA's Triton path.

One call does a whole cycle (the device is lent in short leases):

1. gate (a child process): both our chunked fwd+bwd (``triton_chunk``, ``triton_chunk_split``) and the fused
   recurrent fwd against the float64 oracle (on the GPU) at awkward shapes (T = 1, 63, 65, 1000; H = 3;
   K != V) and at the target shapes with a reduced T, bf16 and fp32, both regimes, with and without initial
   state, random cotangents on o and the final state;
2. at each target shape, on fresh random bf16 inputs: each impl's o and input gradients against torch_chunk
   in fp32 (the harness's full-shape reference), then its time (triton.testing.do_bench median, L2
   flushed), fwd and fwd+bwd, and the peak memory of fwd+bwd; FLA 0.6.0's Triton path beside ours
   (``FLA_FLASH_QLA=0``; its Hopper guard for the gated backward, FLA #640, bypassed: it is checked here
   like ours) and, with ``--impls ...,flash_qla``, FlashQLA (both its wheel sets installed); a markdown table
   last.

Free of the harness (no pydantic on the device image). Usage::

    python benchmarks/gdn_kernels.py [--out DIR] [--skip-gate] [--gate quick] [--impls a,b] [--shapes N]
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
os.environ.setdefault("FLA_TILELANG", "0")

import torch
import triton
from triton.testing import do_bench

from deltabench.correctness.tolerances import threshold
from deltabench.kernels.gdn.torch.torch_chunk import gdn_torch_chunk
from deltabench.kernels.gdn.triton import local_bwd, output, state, walk, wy
from deltabench.kernels.gdn.triton.chunk import chunk_gated_delta_rule
from deltabench.kernels.gdn.triton.chunk_split import chunk_gated_delta_rule_split
from deltabench.kernels.gdn.triton.fused_recurrent import fused_recurrent_gated_delta_rule
from deltabench.references.gdn import gdn_recurrent, make_inputs

TARGETS = [(8, 4096, 6, 128), (4, 8192, 16, 128), (1, 32768, 16, 128), (1, 1024, 6, 128), (4, 4096, 6, 128)]


def with_walk_segments(segments: int):
    """chunk_gated_delta_rule_split to be checked and timed with its state walks (forward and backward) cut into
    `segments` walked side by side: ``run_timing`` sets kernels/gdn/triton/walk.py's ``SEGMENTS`` (off in the
    library until timed here) around the impl's check and timings, backward included."""

    def fn(*args, **kwargs):
        return chunk_gated_delta_rule_split(*args, **kwargs)

    fn.walk_segments = segments  # type: ignore[attr-defined]
    return fn


OURS = {
    "triton_chunk": chunk_gated_delta_rule,
    "triton_chunk_split": chunk_gated_delta_rule_split,
    **{f"triton_chunk_split_seg{n}": with_walk_segments(n) for n in (4, 8, 16)},
}
# the gate's bounds for these inputs (correctness/tolerances.py, typical regime), relative Frobenius error
BOUNDS = {
    dtype: {
        "o": threshold(name, "output", regime="typical"),
        "ht": threshold(name, "final_state", regime="typical"),
        "grad": threshold(name, "grad:q", regime="typical"),
    }
    for dtype, name in ((torch.bfloat16, "bf16"), (torch.float32, "fp32"))
}
LOG: list[dict] = []
GATED = ("triton_chunk", "triton_chunk_split")  # the gate runs these (each in its launch defaults)
GATES = ("q", "k", "v", "g", "beta")
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


def gate_case(B, T, H, K, V, dtype, regime, h0, seed=0, chunk_fn=chunk_gated_delta_rule) -> dict:
    """One of our chunked fwd+bwd (`chunk_fn`) and the recurrent fwd vs the float64 oracle at one case."""
    x = make_inputs(B, T, H, K, V, dtype=dtype, device=DEVICE, seed=seed, regime=regime, initial_state=h0)
    ours = {n: t.clone().requires_grad_(True) for n, t in x.items()}
    ref = {n: t.double().clone().requires_grad_(True) for n, t in x.items()}
    gen = torch.Generator(device=DEVICE).manual_seed(seed + 1)
    do = torch.randn(B, T, H, V, device=DEVICE, generator=gen).to(dtype)
    dht = torch.randn(B, H, K, V, device=DEVICE, generator=gen) * 0.1
    o, ht = chunk_fn(ours["q"], ours["k"], ours["v"], ours["g"], ours["beta"], initial_state=ours.get("initial_state"))
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
    for (B, T, H, K, V, dtype, regime, h0), impl in ((c, i) for c in cases for i in GATED):
        t0 = time.time()
        try:
            r = gate_case(B, T, H, K, V, dtype, regime, h0, chunk_fn=OURS[impl])
        except Exception as e:
            frames = [f"{os.path.basename(f.filename)}:{f.lineno}" for f in traceback.extract_tb(e.__traceback__)]
            say(f"crash in {' <- '.join(reversed(frames[-4:]))}")
            r = {
                "errs": {"o": float("inf"), "dk": float("inf")},
                "fails": [f"crash {type(e).__name__}: {str(e)[:200]}"],
            }
        ok &= not r["fails"]
        name = f"{impl} B{B}-T{T}-H{H}-K{K}-V{V}-{str(dtype)[6:]}-{regime}-h0{int(h0)}"
        worst = max(r["errs"].items(), key=lambda kv: kv[1])
        verdict = "PASS" if not r["fails"] else "FAIL " + ",".join(r["fails"])
        errs = f"worst {worst[0]}={worst[1]:.1e} o={r['errs']['o']:.1e} dk={r['errs']['dk']:.1e}"
        say(f"gate {name:62s} {verdict} {errs} ({time.time() - t0:.1f}s)")
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
    fla_chunk_o.TRITON_ABOVE_3_7_1 = True  # bypass FLA #640's guard (read only there), as kernels/external/fla.py
    return fla_chunk, fla_rec


def flash_qla_fn():
    """FlashQLA's chunked GDN in the FLA calling convention (q, k already normalised), or None if it is missing
    (its two wheel sets: benchmarks/gpu/README.md)."""
    try:
        import flash_qla
    except Exception as e:
        say(f"FlashQLA unavailable: {e!r}")
        return None

    def chunk(q, k, v, g, beta, output_final_state=True):
        return flash_qla.chunk_gated_delta_rule(
            q, k, v, g, beta, output_final_state=output_final_state, use_qk_l2norm_in_kernel=False
        )

    return chunk


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


def time_impl(label, chunk_fn, x, do) -> dict:
    """fwd, fwd+bwd and peak memory of one impl at one shape."""
    q, k, v, g, beta = (x[n] for n in ("q", "k", "v", "g", "beta"))
    res = {}
    with torch.no_grad():
        res["fwd"] = bench_ms(lambda: chunk_fn(q, k, v, g, beta, output_final_state=True))
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v, g, beta)]

    def fwd_bwd():
        o, _ = chunk_fn(*leaves, output_final_state=True)
        o.backward(do)

    res["fwd+bwd"] = bench_ms(fwd_bwd, grad_to_none=leaves)
    for t in leaves:
        t.grad = None
    res["peak_mib"] = peak_mib(fwd_bwd)
    return res


def reference_grads(x, do) -> dict[str, torch.Tensor]:
    """torch_chunk in fp32 (the harness's full-shape reference) on the bf16 inputs: o and every input gradient."""
    leaves = {n: x[n].float().clone().requires_grad_(True) for n in GATES}
    o, _ = gdn_torch_chunk(*(leaves[n] for n in GATES))
    o.backward(do.float())
    return {"o": o.detach(), **{"d" + n: t.grad for n, t in leaves.items()}}


def check_impl(fn, x, do, ref) -> dict[str, float]:
    """Relative errors of `fn`'s o and input gradients against `ref` (same inputs, same cotangent)."""
    leaves = {n: x[n].detach().clone().requires_grad_(True) for n in GATES}
    o, _ = fn(*(leaves[n] for n in GATES), output_final_state=True)
    o.backward(do)
    got = {"o": o.detach(), **{"d" + n: t.grad for n, t in leaves.items()}}
    return {n: rel_err(got[n], ref[n].double()) for n in ref}


def run_timing(impls: dict, shapes, tag="v1") -> list[dict]:
    """Check (vs torch_chunk fp32, fresh random inputs) and time each impl at each shape, a line each."""
    rows = []
    bound = BOUNDS[torch.bfloat16]
    for B, T, H, D in shapes:
        seed = int(time.time() * 1000) % 2**31
        x = make_inputs(B, T, H, D, D, dtype=torch.bfloat16, device="cuda", seed=seed)
        do = torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16)
        ref = reference_grads(x, do)
        for name, fn in impls.items():
            t0 = time.time()
            row = {"tag": tag, "shape": (B, T, H, D), "impl": name, "seed": seed}
            try:
                walk.SEGMENTS = getattr(fn, "walk_segments", 1)
                row["errs"] = check_impl(fn, x, do, ref)
                fails = [n for n, e in row["errs"].items() if e > (bound["o"] if n == "o" else bound["grad"])]
                row["verdict"] = "PASS" if not fails else "FAIL " + ",".join(fails)
                row.update(time_impl(name, fn, x, do))
            except Exception as e:
                row["verdict"] = f"crash {type(e).__name__}: {str(e)[:160]}"
                say(f"time {tag} {B},{T},{H},{D} {name}: {row['verdict']}")
                rows.append(row)
                LOG.append({"timing": row})
                if "CUDA" in str(e):
                    return rows  # the context is poisoned: nothing after this would run
                continue
            finally:
                walk.SEGMENTS = 1
            worst = max(row["errs"].items(), key=lambda kv: kv[1])
            say(
                f"time {tag} {B},{T},{H},{D} {name:20s} fwd {row['fwd']:.3f} fb {row['fwd+bwd']:.3f} ms "
                f"{row['peak_mib']:.0f} MiB | {row['verdict']} worst {worst[0]}={worst[1]:.1e} "
                f"({time.time() - t0:.0f}s)"
            )
            rows.append(row)
            LOG.append({"timing": row})
        del x, do, ref
        torch.cuda.empty_cache()
    return rows


def print_table(rows: list[dict]) -> None:
    """Markdown table: fwd / fwd+bwd ms per shape and impl, and FLA's time over each impl's."""
    fla = {r["shape"]: r for r in rows if r["impl"] == "fla_chunk" and "fwd" in r}
    say("| B,T,H,D | impl | fwd ms | fwd+bwd ms | peak MiB | FLA/impl fwd | FLA/impl fwd+bwd | check |")
    say("|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "fwd" not in r:
            say(f"| {r['shape']} | {r['impl']} | - | - | - | - | - | {r['verdict']} |")
            continue
        f = fla.get(r["shape"])
        ratio = (f"{f['fwd'] / r['fwd']:.2f} | {f['fwd+bwd'] / r['fwd+bwd']:.2f}") if f else "- | -"
        shape = ",".join(map(str, r["shape"]))
        times = f"{r['fwd']:.3f} | {r['fwd+bwd']:.3f} | {r['peak_mib']:.0f}"
        say(f"| {shape} | {r['impl']} | {times} | {ratio} | {r['verdict']} |")


def kernel_resources() -> None:
    """Registers and spills of every compiled variant of our kernels (best effort across Triton versions)."""
    kernels = {
        "wy_inverse": wy.wy_inverse_kernel,
        "wy_apply": wy.wy_apply_kernel,
        "state_fwd": state.state_fwd_kernel,
        "state_walk": walk.state_walk_kernel,
        "segment_summary": walk.segment_summary_kernel,
        "chunk_output": output.chunk_output_kernel,
        "state_bwd": state.state_bwd_kernel,
        "bwd_segment_summary": state.bwd_segment_summary_kernel,
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


def main() -> int:
    """Gate, check and time, write the log; exit 1 when the gate fails."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--skip-gate", action="store_true")
    ap.add_argument(
        "--impls",
        default="triton_chunk,triton_chunk_split,fla_chunk",
        help="comma-separated, in order: triton_chunk, triton_chunk_split[_seg4|_seg8|_seg16], fla_chunk, flash_qla",
    )
    ap.add_argument(
        "--gate-only", choices=["full", "quick", "t1", "k64", "k256"], help="(internal) run the gate in this process"
    )
    ap.add_argument("--gate", default="full", choices=["full", "quick"], help="which gate the child runs")
    ap.add_argument("--shapes", type=int, default=len(TARGETS), help="time only the first N target shapes")
    ap.add_argument("--tag", default="v1", help="version label of the timing lines")
    args = ap.parse_args()
    if args.gate_only == "t1":
        return 0 if run_gate([(2, 1, 3, 64, 128, torch.bfloat16, "typical", False)]) else 1
    if args.gate_only in ("k64", "k256"):  # the head sizes outside wy.TUNED_K, each case twice
        bf = torch.bfloat16
        if args.gate_only == "k64":
            cases = [(2, 1, 3, 64, 128, bf, "long", True), (2, 65, 3, 64, 128, bf, "typical", True)]
            cases += [(2, 65, 3, 64, 128, bf, "long", False), (2, 200, 3, 64, 128, bf, "long", True)]
        else:
            cases = [(1, 130, 2, 256, 256, bf, "long", True), (1, 70, 2, 256, 256, bf, "typical", False)]
        return 0 if run_gate(cases + cases) else 1
    if args.gate_only == "quick":  # a short lease: few compiled variants
        bf = torch.bfloat16
        cases = [(2, T, 3, 64, 128, bf, r, True) for T in (1, 65, 1000) for r in ("typical", "long")]
        cases += [(8, 256, 6, 128, 128, bf, "typical", False), (1, 130, 2, 256, 256, bf, "long", True)]
        return 0 if run_gate(cases) else 1
    say(f"torch {torch.__version__} triton {triton.__version__} {torch.cuda.get_device_name()}")
    ok = True
    if not args.skip_gate and args.gate_only is None:
        # in a child process: an illegal memory access would poison this process's CUDA context
        ok = subprocess.run([sys.executable, __file__, "--gate-only", args.gate]).returncode == 0
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
    impls = {}
    for name in args.impls.split(","):
        if name == "fla_chunk":
            fla = fla_fns()
            if fla is not None:
                impls[name] = fla[0]
        elif name == "flash_qla":
            qla = flash_qla_fn()
            if qla is not None:
                impls[name] = qla
        elif name in OURS:
            impls[name] = OURS[name]
        else:
            ap.error(f"unknown impl {name!r} (known: {', '.join([*OURS, 'fla_chunk', 'flash_qla'])})")
    t0 = time.time()
    rows = run_timing(impls, TARGETS[: args.shapes], tag=args.tag)
    say(f"timing done ({time.time() - t0:.0f}s)")
    kernel_resources()
    with open(os.path.join(args.out, "gdn_kernels.json"), "w") as f:
        json.dump(LOG, f, indent=1, default=str)
    print_table(rows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
