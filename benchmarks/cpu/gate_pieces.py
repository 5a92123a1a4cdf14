"""Where one job's correctness gate spends its host (CPU) time, at a suite's shape, without a GPU.

    python benchmarks/cpu/gate_pieces.py B=8,T=4096,H=6,K=128,V=128 [--mode fwd+bwd] [--dtype bf16] [--seeds 1]
        [--oracle-device cpu] [--profile N]

Runs ``verify_case`` on the CPU as the runner calls it (``--seeds`` consecutive seeds plus a drawn one, every
regime, the on-disk reference cache off so that every reference is computed, as for a run's drawn seed) with two
stand-ins: the impl and the full-shape ``torch_chunk`` reference are replaced by a call that returns ``v`` and the
initial state (a few element-wise ops), because on a GPU host both are device work of milliseconds while here they
would take minutes. What is left is what the GPU host's CPU does per job: the inputs' draws at the full shape, the
float64 oracle at the reduced case and the length sweep, the record keeping; plus the full-shape comparisons and
copies, which run on the device there (reported apart, as ``device-side here``). Prints seconds per piece from
cProfile's cumulative times (`--profile N`: also the N costliest functions).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import time
from typing import Any

os.environ["DELTABENCH_REFERENCE_CACHE"] = "off"

import torch

from deltabench.correctness import calls, engine, oracle, plan
from deltabench.harness.cases import Case


def standin(q: Any, k: Any, v: Any, g: Any, beta: Any, scale: Any = None, initial_state: Any = None) -> Any:
    """A GDN-shaped call that costs next to nothing: o = v, the state = the initial state (or zeros), both
    connected to every input so that gradients flow."""
    B, _, H, K = q.shape
    s = initial_state if initial_state is not None else torch.zeros(B, H, K, v.shape[-1], device=v.device)
    tie = (q[:1, :1, :1, :1].float().sum() + k[:1, :1, :1, :1].float().sum() + g[:1, :1, :1].sum()
           + beta[:1, :1, :1].float().sum()) * 0  # fmt: skip
    return v * 1 + tie.to(v.dtype), s.float() + tie


standin.backend = "torch"  # type: ignore[attr-defined]
standin.name = "standin"  # type: ignore[attr-defined]

# Pieces by the function whose cumulative time they are (the outermost call of each).
PIECES = {
    "draws (make_case_inputs, cotangents)": [("ops.py", "make_case_inputs"), ("verify.py", "_cotangents")],
    "oracle, reduced case (float64)": [("verify.py", "_reduced_oracle")],
    "length sweep (oracle + streaming)": [("verify.py", "_length_sweep")],
    "full-shape compares (device-side here)": [("verify.py", "_compare_items")],
    "streaming at full shape (device-side here)": [("verify.py", "_streaming")],
}


def host_pieces(case: Case, seeds: int, dispatch_only: bool = False) -> None:
    """Time the gate's host pieces one by one, as ``verify_case`` makes them: every (seed, variant)'s draws at
    the full shape (the remembered-draws cache emptied first: a worker's first job at the shape), then the same
    draws again (its next job at the shape), the oracle at the reduced case and the length sweep.

    `dispatch_only`: the oracle's pieces at K = V = 2 (the limit scaled so that the runs stack as a GPU case's
    would at the real K and V) and no draws: what issuing the same torch ops costs the host when their arithmetic
    is elsewhere, an estimate of the host's share of an oracle run on a GPU (its launch latency not included)."""
    from deltabench.harness.ops import get_op, make_case_inputs
    from deltabench.references import _inputs

    spec = get_op(case.op)
    grads = case.mode != "fwd"
    limit = plan.ORACLE_MAX_ELEMENTS_GRAD if grads else plan.ORACLE_MAX_ELEMENTS
    seed_list = [case.seed + i for i in range(seeds)] + [12345]
    variants = plan.gate_variants(spec, spec.regimes)

    def timed(fn: Any) -> tuple[float, float]:
        """Wall seconds and this process's CPU seconds (all threads) of `fn()`: on a shared host the CPU
        seconds are the steadier figure."""
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        return time.perf_counter() - w0, time.process_time() - c0

    def draws() -> None:
        for s in seed_list:
            for v in variants:
                sub = case.replace(seed=s, initial_state=v.h0, regime=v.regime)
                make_case_inputs(spec, sub, unit_qk=v.unit_qk)
                if grads:
                    calls.draw_cotangents(spec, sub, s)

    _inputs._draws.clear()
    cold = warm = (0.0, 0.0)
    if not dispatch_only:
        cold = timed(draws)
        warm = timed(draws)
    short = plan.short_case(case, limit)
    lengths = plan.sweep_cases(case, spec.regimes, grads=grads, limit=limit)
    if dispatch_only:
        factor = case.dims["K"] * case.dims["V"] / 4
        short = short.replace(K=2, V=2)
        lengths = [(c.replace(K=2, V=2), t1) for c, t1 in lengths]
        limit = max(limit, plan.ORACLE_MAX_ELEMENTS) / factor  # stacked as on a GPU (oracle.stack_limit)
    runs = [(s, v) for s in seed_list for v in variants]
    oracle = timed(
        lambda: engine._reduced_oracle(standin, spec, short, runs, grads=grads, profile="native", limit=limit)
    )
    sweep = timed(
        lambda: engine._length_sweep(
            standin, spec, lengths, seed=seed_list[0], grads=grads, profile="native", limit=limit
        )
    )
    print(
        f"{case.shape_id} {case.dtype} {case.mode} seeds {seed_list} threads {torch.get_num_threads()}, "
        f"{len(runs)} full-shape draws, oracle at {short.shape_id}, sweep T={[c.T for c, _ in lengths]}:"
    )
    rows = [
        ("draws, first job at the shape", cold),
        ("draws, a later job (remembered)", warm),
        ("oracle at the reduced case", oracle),
        ("length sweep (oracle, streamed)", sweep),
        ("host total (first job)", tuple(a + b + c for a, b, c in zip(cold, oracle, sweep, strict=True))),
    ]
    for name, (wall, cpu) in rows:
        print(f"  {name:34s} wall {wall:7.2f} s  cpu {cpu:7.2f} s")


def main() -> None:
    """Parse the arguments, run the gate once under cProfile, print the pieces."""
    ap = argparse.ArgumentParser()
    ap.add_argument("shape")
    ap.add_argument("--mode", default="fwd")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--profile", type=int, default=0)
    ap.add_argument("--host-only", action="store_true", help="time the host pieces alone (no full-shape calls)")
    ap.add_argument("--dispatch-only", action="store_true", help="--host-only, the oracle at K = V = 2, no draws")
    args = ap.parse_args()
    dims = {k: int(v) for k, v in (kv.split("=") for kv in args.shape.split(","))}
    case = Case("gdn", **dims, dtype=args.dtype, mode=args.mode)
    oracle.chunk_reference = lambda case: standin  # the full-shape reference: device work on a GPU host
    if args.host_only or args.dispatch_only:
        host_pieces(case, args.seeds, dispatch_only=args.dispatch_only)
        return
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    report = engine.verify_case(standin, case, seeds=args.seeds, drawn_seed=12345)
    prof.disable()
    wall = time.perf_counter() - t0
    st = pstats.Stats(prof)
    cum: dict[tuple[str, str], float] = {}
    for (file, _, fn), (_, _, _, ct, _) in st.stats.items():  # type: ignore[attr-defined]
        key = (os.path.basename(file), fn)
        cum[key] = max(cum.get(key, 0.0), ct)
    print(f"{case.shape_id} {args.dtype} {args.mode} seeds {report.seeds} threads {torch.get_num_threads()}: "
          f"gate {wall:.2f} s (under cProfile), {len(report.records)} records")  # fmt: skip
    for name, fns in PIECES.items():
        print(f"  {name:44s} {sum(cum.get(f, 0.0) for f in fns):7.2f} s")
    for f in [
        ("verify.py", "_oracle_runs"),
        ("_inputs.py", "randn"),
        ("_inputs.py", "finish"),
        ("_inputs.py", "l2norm"),
    ]:
        print(f"    of which {f[0]}:{f[1]:30s} {cum.get(f, 0.0):7.2f} s")
    if args.profile:
        st.sort_stats("cumulative").print_stats(args.profile)


if __name__ == "__main__":
    main()
