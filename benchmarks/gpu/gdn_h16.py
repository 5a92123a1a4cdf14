"""deltabench's Triton GDN at 16 heads and long T on the GPU: kernel-by-kernel times beside FLA, launch sweeps, the
shape dispatch's table. One process per call (a diagnostic, not a gate: the gated times come from `deltabench run`).

    python benchmarks/gpu/gdn_h16.py profile [--shapes all|h16] [--impls a,b,...]   # check, time, kernels
    python benchmarks/gpu/gdn_h16.py sweep [--shapes h16]                            # walk / state_bwd configs

``profile``: at each shape, fresh bf16 inputs; each impl's o and input gradients against torch_chunk in fp32 (the
harness's full-shape reference, bound 1e-2 / 8e-3 as gdn_kernels.py), then do_bench medians (L2 flushed) of fwd and
fwd+bwd, then torch.profiler's per-kernel device time over a few fwd+bwd calls (FLA's kernels too), one line each.
``sweep``: walk.py's state_walk and state.py's state_bwd alone, per launch config and segment count, each result
compared with the library default's (relative max difference of h / v_new, dh / dv_new).

Floors at the five train shapes (B, T, H, K = V = 128, bf16; N = B*T*H token-heads; chunk C = 64):
FLOPs per chunk-head (2mnk each): forward A = k k^T 1.05 M, W and U 2.1 M, the walk's W S and kdec^T v_new 4.2 M,
the output's q S 2.1 M, q k^T and M v_new 2.1 M: ~11.5 MFLOP, ~0.18 MFLOP a token-head; the backward about twice
(the two walks' products again, dq, dk, dv, dA): ~0.4 MFLOP a token-head. Bytes a token-head, each input read once
and each output written once: forward q, k, v, o 256 B each, g 4, beta 2: ~1.03 KB; backward reads q, k, v, g,
beta, do and writes dq, dk, dv, dg, dbeta: ~1.55 KB (plus the forward's if it is recomputed). Rates: 4.3 TB/s
copy, ~790 TFLOP/s bf16 dense (KINDS.md).

| shape | N | fwd bytes / 4.3 TB/s | fwd FLOP / 790 T | fwd+bwd bytes | fwd+bwd FLOP | floor fwd / fwd+bwd |
|---|---|---|---|---|---|---|
| 8,4096,6 | 196,608 | 0.047 ms | 0.045 ms | 0.12 ms | 0.15 ms | ~0.05 / ~0.15 ms |
| 4,8192,16 | 524,288 | 0.126 ms | 0.12 ms | 0.32 ms | 0.39 ms | ~0.13 / ~0.39 ms |
| 1,32768,16 | 524,288 | 0.126 ms | 0.12 ms | 0.32 ms | 0.39 ms | ~0.13 / ~0.39 ms |
| 1,1024,6 | 6,144 | 1.5 us | 1.4 us | 3.7 us | 4.6 us | launch-bound (~5 us a launch) |
| 4,4096,6 | 98,304 | 0.024 ms | 0.022 ms | 0.06 ms | 0.075 ms | ~0.025 / ~0.075 ms |

A third floor at the long shapes is the state walk's serial depth: T / 64 dependent chunk steps (512 at 1x32768x16,
128 at 4x8192x16), each two dependent [64, 128] x [128, BV] products through shared memory (~1-2 us measured).
FLA's forward at 4x8192x16 (0.85 ms) sits at ~6.5x its floor, ours (1.38 ms) at ~10x.
"""
# ruff: noqa: B023, F821, B007, B905  (closures timed inside the loop that binds them; the loop's tensors are
# deleted at its end to free the GPU, which ruff reads as a later use of undefined names)

from __future__ import annotations

import argparse
import collections
import os
import sys
import time

os.environ.setdefault("FLA_FLASH_QLA", "0")
os.environ.setdefault("FLA_TILELANG", "0")

import torch
from triton.testing import do_bench

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import gdn_kernels as gk

from deltabench.kernels.gdn.triton import chunk_split, state, walk
from deltabench.references.gdn import make_inputs

SHAPES = {
    "all": gk.TARGETS,
    "h16": [(4, 8192, 16, 128), (1, 32768, 16, 128)],
    "big": [(8, 4096, 6, 128), (4, 8192, 16, 128), (1, 32768, 16, 128)],
    "small": [(1, 1024, 6, 128), (4, 4096, 6, 128)],
}


def say(msg: str) -> None:
    print(msg, flush=True)


def before(module: str):
    """The kernels as they were at deltabench commit 6d259af (the branch's base), for before/after in one process:
    a copy of kernels/gdn/triton and kernels/common/triton under ``_before/`` beside this checkout's root (made by
    the call's command from ``git archive``; absent: None)."""
    import importlib

    root = os.path.join(os.path.dirname(__file__), "..", "..")
    if not os.path.isdir(os.path.join(root, "_before")):
        return None
    sys.path.insert(0, root)
    return importlib.import_module(f"_before.kernels.gdn.triton.{module}")


def with_overrides(fn, **over):
    """`fn` run with module launch tables overridden: ``over`` maps "module.TABLE.key" (wy / walk / auto) to a
    value, set around the check and the timings by profile_cmd."""

    def wrapped(*a, **kw):
        return fn(*a, **kw)

    wrapped.overrides = over  # type: ignore[attr-defined]
    return wrapped


def impls(names: str) -> dict:
    """Named fwd callables ``fn(q, k, v, g, beta, output_final_state=True)``: ours from gdn_kernels.OURS, the
    library's ``triton_chunk_auto``, the base commit's (``before_*``), variants with launch overrides, FLA's."""
    from deltabench.kernels.gdn.triton import auto

    variants = {
        "triton_chunk_auto": auto.chunk_gated_delta_rule_auto,
        "split_merge_tf32": with_overrides(gk.OURS["triton_chunk_split"], **{"wy.LAUNCH.merge_tf32": True}),
        "split_wy1": with_overrides(gk.OURS["triton_chunk_split"], **{"wy.LAUNCH.warps": 1}),
        "split_walk643": with_overrides(gk.OURS["triton_chunk_split"], **{"walk.LAUNCH.stages": 3}),
        "auto_seg4": with_overrides(auto.chunk_gated_delta_rule_auto, **{"auto.RULE.segments": 4}),
        "auto_noseg": with_overrides(auto.chunk_gated_delta_rule_auto, **{"auto.RULE.segment_max_heads": 0}),
    }
    out = {}
    for name in names.split(","):
        if name == "fla_chunk":
            fla = gk.fla_fns()
            if fla is not None:
                out[name] = fla[0]
        elif name in gk.OURS:
            out[name] = gk.OURS[name]
        elif name in variants:
            out[name] = variants[name]
        elif name == "before_split":
            mod = before("chunk_split")
            if mod is not None:
                out[name] = mod.chunk_gated_delta_rule_split
        elif name == "before_chunk":
            mod = before("chunk")
            if mod is not None:
                out[name] = mod.chunk_gated_delta_rule
        else:
            raise SystemExit(f"unknown impl {name}")
    return out


def apply_overrides(over: dict) -> dict:
    """Set "module.TABLE.key" values; returns the old ones (to restore with the same call)."""
    from deltabench.kernels.gdn.triton import auto, wy

    mods = {"wy": wy, "walk": walk, "auto": auto}
    old = {}
    for path, value in over.items():
        mod, table, key = path.split(".")
        d = getattr(mods[mod], table)
        old[path] = d[key]
        d[key] = value
    return old


def kernel_times(fn, iters: int = 5) -> list[tuple[str, float, int]]:
    """(kernel, us per call, launches per call) of `fn` under torch.profiler, largest first."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    events = []
    for e in prof.events():
        dev = getattr(e, "device_type", None)
        if dev is None or "CUDA" not in str(dev):
            continue
        t = getattr(e, "device_time", None) or getattr(e, "cuda_time", 0.0)
        events.append((e.time_range.start, e.name, t))
    per_call = collections.Counter(name for _, name, _ in events)
    seen: collections.Counter = collections.Counter()
    agg: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
    for _, name, t in sorted(events):
        n = per_call[name] // iters
        label = name[:60] if n <= 1 or n > 4 else f"{name[:56]}#{seen[name] % n}"  # a kernel's launches in order
        seen[name] += 1
        agg[label][0] += t
        agg[label][1] += 1
    rows = [(n, t / iters, c // iters) for n, (t, c) in agg.items()]
    return sorted(rows, key=lambda r: -r[1])


def profile_cmd(args) -> int:
    names = impls(args.impls)
    bound = gk.BOUNDS[torch.bfloat16]
    table = []
    ok = True
    for B, T, H, D in SHAPES[args.shapes]:
        seed = int(time.time() * 1000) % 2**31
        x = make_inputs(B, T, H, D, D, dtype=torch.bfloat16, device="cuda", seed=seed)
        do = torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16)
        ref = gk.reference_grads(x, do)
        for name, fn in names.items():
            t0 = time.time()
            walk.SEGMENTS = getattr(fn, "walk_segments", 1)
            restore = apply_overrides(getattr(fn, "overrides", {}))
            try:
                errs = gk.check_impl(fn, x, do, ref)
                fails = [n for n, e in errs.items() if e > (bound["o"] if n == "o" else bound["grad"])]
                ok &= not fails
                res = gk.time_impl(name, fn, x, do)
                leaves = [x[n].detach().clone().requires_grad_(True) for n in gk.GATES]

                def fb():
                    o, _ = fn(*leaves, output_final_state=True)
                    o.backward(do)

                kt = kernel_times(fb) if args.kernels else []
            except Exception as e:
                say(f"{B},{T},{H},{D} {name}: crash {type(e).__name__}: {str(e)[:200]}")
                if "CUDA" in str(e):
                    return 2
                continue
            finally:
                walk.SEGMENTS = 1
                apply_overrides(restore)
            worst = max(errs.items(), key=lambda kv: kv[1])
            verdict = "PASS" if not fails else "FAIL " + ",".join(fails)
            say(
                f"time {B},{T},{H},{D} {name:24s} fwd {res['fwd']:.3f} fb {res['fwd+bwd']:.3f} ms "
                f"{res['peak_mib']:.0f} MiB | {verdict} worst {worst[0]}={worst[1]:.1e} ({time.time() - t0:.0f}s)"
            )
            for kname, us, n in kt:
                if us >= 2.0:
                    say(f"  kern {B},{T},{H} {name:18s} {us:8.1f} us x{n} {kname}")
            table.append(((B, T, H, D), name, res))
        for rep in range(1, args.repeat):  # the impls again, in turn: each keeps its best median
            for s_, name, res in [r for r in table if r[0] == (B, T, H, D)]:
                fn = names[name]
                walk.SEGMENTS = getattr(fn, "walk_segments", 1)
                restore = apply_overrides(getattr(fn, "overrides", {}))
                try:
                    again = gk.time_impl(name, fn, x, do)
                finally:
                    walk.SEGMENTS = 1
                    apply_overrides(restore)
                say(f"again {B},{T},{H},{D} {name:24s} fwd {again['fwd']:.3f} fb {again['fwd+bwd']:.3f} ms")
                res["fwd"] = min(res["fwd"], again["fwd"])
                res["fwd+bwd"] = min(res["fwd+bwd"], again["fwd+bwd"])
        del x, do, ref
        torch.cuda.empty_cache()
    fla = {s: r for s, n, r in table if n == "fla_chunk"}
    say("| B,T,H,D | impl | fwd ms | fwd+bwd ms | FLA/impl fwd | FLA/impl fwd+bwd |")
    say("|---|---|---|---|---|---|")
    for s, n, r in table:
        f = fla.get(s)
        ratio = f"{f['fwd'] / r['fwd']:.2f} | {f['fwd+bwd'] / r['fwd+bwd']:.2f}" if f else "- | -"
        say(f"| {','.join(map(str, s))} | {n} | {r['fwd']:.3f} | {r['fwd+bwd']:.3f} | {ratio} |")
    return 0 if ok else 1


def rel_max(a: torch.Tensor, ref: torch.Tensor) -> float:
    a, ref = a.float(), ref.float()
    if not torch.isfinite(a).all():
        return float("inf")
    return ((a - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


WALK_CONFIGS = [(64, 4, 2), (64, 4, 3), (64, 4, 4), (16, 4, 2), (16, 4, 3), (64, 8, 2)]
BWD_CONFIGS = [(64, 4, 2), (64, 4, 3), (16, 4, 3), (16, 4, 4), (16, 4, 2), (64, 8, 2), (64, 8, 3)]
LBWD_CONFIGS = [
    (64, 8, 2, True),
    (64, 8, 3, True),
    (64, 4, 2, True),
    (128, 8, 2, True),
    (64, 8, 1, True),
    (32, 4, 2, True),
]
SFWD_CONFIGS = [(64, 8, 1), (64, 4, 2), (64, 4, 3), (16, 4, 2), (16, 4, 3)]


def sweep_cmd(args) -> int:
    """Each stage alone per launch config, its results against the library default's (relative max difference)."""
    from deltabench.kernels.gdn.triton import wy

    for B, T, H, D in SHAPES[args.shapes]:
        x = make_inputs(B, T, H, D, D, dtype=torch.bfloat16, device="cuda", seed=7, initial_state=True)
        q, k, v, beta = (x[n].contiguous() for n in ("q", "k", "v", "beta"))
        g, h0 = x["g"].float().contiguous(), x["initial_state"].float().contiguous()
        L_ref, w, u = wy.wy_fwd(k, v, g, beta)
        do = torch.randn_like(v)
        scale = D**-0.5
        if "wy" in args.what:
            for tf32 in (False, True):
                wy.LAUNCH["merge_tf32"] = tf32
                for warps in (1, 2, 4):
                    L2, w2, u2 = wy.wy_fwd(k, v, g, beta, config=(warps, 1))
                    ms = do_bench(lambda: wy.wy_fwd(k, v, g, beta, config=(warps, 1)), rep=60)
                    low = torch.ones(64, 64, device="cuda").tril().bool()
                    dl = rel_max(L2.view(-1, 64, 64)[:, low], L_ref.view(-1, 64, 64)[:, low]) if T % 64 == 0 else -1
                    say(
                        f"wy   {B},{T},{H} warps{warps} tf32={tf32}: {ms:.3f} ms  w {rel_max(w2, w):.1e} "
                        f"u {rel_max(u2, u):.1e} L {dl:.1e}"
                    )
            wy.LAUNCH["merge_tf32"] = False
        if "walk" in args.what:
            h_ref, vn_ref, ht_ref = walk.state_walk(k, w, u, g, h0, True)
            for seg in (1, 4, 8) if B * H <= 16 else (1,):
                for cfg in WALK_CONFIGS:
                    h, vn, ht = walk.state_walk(k, w, u, g, h0, True, config=cfg, segments=seg)
                    ms = do_bench(lambda: walk.state_walk(k, w, u, g, h0, True, config=cfg, segments=seg), rep=60)
                    say(
                        f"walk {B},{T},{H} seg{seg} {cfg}: {ms:.3f} ms  h {rel_max(h, h_ref):.1e} "
                        f"vn {rel_max(vn, vn_ref):.1e} ht {rel_max(ht, ht_ref):.1e}"
                    )
        if "sbwd" in args.what:
            dh_ref, dv_ref, _ = state.state_bwd(q, k, w, g, do, None, scale)
            for seg in (1,):
                for cfg in BWD_CONFIGS:
                    try:
                        dh, dv, _ = state.state_bwd(q, k, w, g, do, None, scale, config=cfg, segments=seg)
                        ms = do_bench(
                            lambda: state.state_bwd(q, k, w, g, do, None, scale, config=cfg, segments=seg), rep=60
                        )
                    except Exception as e:
                        say(f"sbwd {B},{T},{H} seg{seg} {cfg}: {type(e).__name__} {str(e)[:100]}")
                        if "CUDA" in str(e):
                            return 2
                        continue
                    say(
                        f"sbwd {B},{T},{H} seg{seg} {cfg}: {ms:.3f} ms  dh {rel_max(dh, dh_ref):.1e} "
                        f"dv {rel_max(dv, dv_ref):.1e}"
                    )
        if "lbwd" in args.what or "sfwd" in args.what:
            h, vn, _ = walk.state_walk(k, w, u, g, h0, True)
            dh, dvn, _ = state.state_bwd(q, k, w, g, do, None, scale)
        if "lbwd" in args.what:
            from deltabench.kernels.gdn.triton.local_bwd import local_bwd

            ref = local_bwd(q, k, v, g, beta, L_ref, h, dh, vn, dvn, do, scale)
            for cfg in LBWD_CONFIGS:
                try:
                    out = local_bwd(q, k, v, g, beta, L_ref, h, dh, vn, dvn, do, scale, config=cfg)
                    ms = do_bench(
                        lambda: local_bwd(q, k, v, g, beta, L_ref, h, dh, vn, dvn, do, scale, config=cfg), rep=60
                    )
                except Exception as e:
                    say(f"lbwd {B},{T},{H} {cfg}: {type(e).__name__} {str(e)[:100]}")
                    if "CUDA" in str(e):
                        return 2
                    continue
                diffs = " ".join(
                    f"{n} {rel_max(a, b):.1e}" for n, a, b in zip(("dq", "dk", "dv", "dg", "db"), out, ref)
                )
                say(f"lbwd {B},{T},{H} {cfg}: {ms:.3f} ms  {diffs}")
        if "sfwd" in args.what:
            from deltabench.kernels.gdn.triton.state import LAUNCH as SL

            o_ref = state.state_fwd(q, k, w, u, g, scale, h0, True, False)[0]
            for bv, warps, stages in SFWD_CONFIGS:
                old = dict(SL)
                SL.update(block_v=bv, warps=warps, stages=stages)
                try:
                    o = state.state_fwd(q, k, w, u, g, scale, h0, True, False)[0]
                    ms = do_bench(lambda: state.state_fwd(q, k, w, u, g, scale, h0, True, False), rep=60)
                    say(f"sfwd {B},{T},{H} {(bv, warps, stages)}: {ms:.3f} ms  o {rel_max(o, o_ref):.1e}")
                except Exception as e:
                    say(f"sfwd {B},{T},{H} {(bv, warps, stages)}: {type(e).__name__} {str(e)[:100]}")
                    if "CUDA" in str(e):
                        return 2
                finally:
                    SL.clear()
                    SL.update(old)
        del x, q, k, v, g, beta, w, u, do
        torch.cuda.empty_cache()
    return 0


def gate_cmd(args) -> int:
    """Our chunked impls (and the auto dispatch) against the float64 oracle on the GPU (gdn_kernels.gate_case:
    output, final state, every gradient with random cotangents), at awkward lengths, at the tuned head size
    K = V = 128 with many heads (the 64-column walks in 4 stages, fewer chunks than stages at T = 130) and few
    (16-column walks in 3 stages), and at K = 64 with K != V (the untuned configs). Exit 1 on any failure."""
    from deltabench.kernels.gdn.triton import auto

    fns = {
        "triton_chunk": gk.OURS["triton_chunk"],
        "triton_chunk_split": gk.OURS["triton_chunk_split"],
        "triton_chunk_auto": auto.chunk_gated_delta_rule_auto,
    }
    bf, f32 = torch.bfloat16, torch.float32
    if args.gate_impls:
        fns = {n: fns[n] for n in args.gate_impls.split(",")}
    cases = [
        (8, T, 16, 128, 128, bf, r, h0) for T in (1, 65, 130, 1000) for r, h0 in (("typical", True), ("long", False))
    ]
    cases += [(1, 1000, 6, 128, 128, bf, "typical", True), (4, 250, 6, 128, 128, bf, "long", True)]
    cases += [(1, T, 2, 128, 128, bf, r, True) for T in (63, 130, 700) for r in ("typical", "long")]
    cases += [(2, T, 3, 64, 128, bf, "long", True) for T in (1, 65, 1000)]
    cases += [(1, 300, 2, 128, 128, f32, "typical", True), (4, 200, 16, 128, 128, f32, "long", False)]
    if args.gate_tuned_only:
        cases = [c for c in cases if c[3] == 128 and c[5] == bf]
    ok = True
    for case in cases:
        for name, fn in fns.items():
            t0 = time.time()
            r = gk.gate_case(*case, seed=len(name) + case[1], chunk_fn=fn)
            ok &= not r["fails"]
            worst = max(r["errs"].items(), key=lambda kv: kv[1])
            label = "B{}-T{}-H{}-K{}-V{}-{}-{}-h0{}".format(*case[:5], str(case[5])[6:], case[6], int(case[7]))
            verdict = "PASS" if not r["fails"] else "FAIL " + ",".join(r["fails"])
            say(f"gate {name:18s} {label:40s} {verdict} worst {worst[0]}={worst[1]:.1e} ({time.time() - t0:.1f}s)")
    say(f"gate {'PASSED' if ok else 'FAILED'} ({len(cases) * len(fns)} runs)")
    return 0 if ok else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cmd", choices=["profile", "sweep", "gate"])
    ap.add_argument("--shapes", default="all", choices=list(SHAPES))
    ap.add_argument("--impls", default="triton_chunk,triton_chunk_split,triton_chunk_split_seg8,fla_chunk")
    ap.add_argument("--no-kernels", dest="kernels", action="store_false")
    ap.add_argument("--what", default="wy,walk", help="sweep: any of wy, walk, sbwd, lbwd, sfwd")
    ap.add_argument("--gate-impls", default="", help="gate: only these (comma-separated)")
    ap.add_argument("--gate-tuned-only", action="store_true", help="gate: K = V = 128 cases only")
    ap.add_argument(
        "--repeat", type=int, default=1, help="profile: time every impl this many times in turn, keep the best"
    )
    args = ap.parse_args()
    say(f"torch {torch.__version__} {torch.cuda.get_device_name()}")
    _ = chunk_split  # imported so that a missing module fails here, before any timing
    return {"profile": profile_cmd, "sweep": sweep_cmd, "gate": gate_cmd}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
