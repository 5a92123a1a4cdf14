"""local_bwd's three launches (PARTs 1-3) one at a time on the GPU: each part's time per launch config, its
compiled resources (registers, spills, shared memory), and the full backward with that part's config against the
library default's results (relative max difference). One process; a diagnostic, not a gate.

    python benchmarks/gpu/local_bwd_parts.py [--shapes h16] [--parts 1,2,3]

Inputs are the real ones of a fwd+bwd (wy_fwd, the walk, state_bwd on fresh bf16 inputs), so the masks, decays
and magnitudes are those the library sees. A part timed alone is launched on the buffers the full backward left
(PART 2 adds into dk's fp32 partial each time: the values drift, the work does not).
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

import torch
import triton
from triton.testing import do_bench

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from deltabench.kernels.gdn.triton import local_bwd as lb
from deltabench.kernels.gdn.triton import state, walk, wy
from deltabench.references.gdn import make_inputs

SHAPES = {
    "h16": [(4, 8192, 16, 128), (1, 32768, 16, 128)],
    "big": [(8, 4096, 6, 128), (4, 8192, 16, 128), (1, 32768, 16, 128)],
}
# (V block, warps, stages) per part
CANDIDATES = {
    1: [(64, 8, 3)],
    2: [(64, 4, 2), (128, 4, 2), (64, 4, 1)],
    3: [(128, 4, 1)],
}


def say(msg: str) -> None:
    print(msg, flush=True)


def rel_max(a: torch.Tensor, ref: torch.Tensor) -> float:
    a, ref = a.float(), ref.float()
    if not torch.isfinite(a).all():
        return float("inf")
    return ((a - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


def launch(part: int, cfg: tuple[int, int, int], ins: tuple, outs: tuple, scale: float) -> object:
    """One launch of `part` at `cfg` on the full backward's buffers; returns Triton's compiled kernel."""
    B, T, H, D = ins[0].shape
    NT = triton.cdiv(T, wy.CHUNK)
    bv, nw, ns = cfg
    return lb.local_bwd_kernel[(NT, B * H)](
        *ins, *outs, scale, T, NT, H=H, K=D, V=D, BK=D, BV=bv, C=wy.CHUNK, PREC="tf32", PART=part,
        num_warps=nw, num_stages=ns,
    )  # fmt: skip


def shape(B: int, T: int, H: int, D: int, parts: list[int]) -> int:
    """Every candidate of each part in `parts` at one shape; 2 on a CUDA fault."""
    x = make_inputs(B, T, H, D, D, dtype=torch.bfloat16, device="cuda", seed=11, initial_state=True)
    q, k, v, beta = (x[n].contiguous() for n in ("q", "k", "v", "beta"))
    g, h0 = x["g"].float().contiguous(), x["initial_state"].float().contiguous()
    scale = D**-0.5
    L, w, u = wy.wy_fwd(k, v, g, beta)
    h, vn, _ = walk.state_walk(k, w, u, g, h0, True)
    do = torch.randn_like(v)
    dh, dvn, _ = state.state_bwd(q, k, w, g, do, None, scale)
    ins = (q, k, v, g, beta, L, h, dh, vn, dvn, do)
    ref = lb.local_bwd(*ins, scale)
    base = tuple(lb.LAUNCH["parts"])
    whole = do_bench(lambda: lb.local_bwd(*ins, scale), rep=100, return_mode="median")
    say(f"{B},{T},{H} default {base}: whole {whole * 1e3:.1f} us")
    dg = g.new_empty(B, T, H)
    outs = (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), dg, torch.empty_like(dg))
    outs += (torch.empty_like(q, dtype=torch.float32), torch.empty_like(dg))
    for part in (1, 2, 3):  # fill the partial buffers as the full backward does
        launch(part, base[part - 1], ins, outs, scale)
    for part in parts:
        for cfg in CANDIDATES[part]:
            try:
                kern = launch(part, cfg, ins, outs, scale)
                us = (
                    do_bench(functools.partial(launch, part, cfg, ins, outs, scale), rep=100, return_mode="median")
                    * 1e3
                )
                chosen = list(base)
                chosen[part - 1] = cfg
                out = lb.local_bwd(*ins, scale, parts=tuple(chosen))
            except Exception as e:  # a config that does not compile or launch: next
                say(f"{B},{T},{H} part{part} {cfg}: {type(e).__name__} {str(e)[:120]}")
                if "CUDA" in str(e):
                    return 2
                continue
            names = ("dq", "dk", "dv", "dg", "db")
            diffs = " ".join(f"{n} {rel_max(a, b):.0e}" for n, a, b in zip(names, out, ref, strict=True))
            res = f"regs {kern.n_regs} spills {kern.n_spills} smem {kern.metadata.shared}"
            say(f"{B},{T},{H} part{part} {cfg}: {us:7.1f} us  {res} | {diffs}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="h16", choices=list(SHAPES))
    ap.add_argument("--parts", default="1,2,3")
    args = ap.parse_args()
    for B, T, H, D in SHAPES[args.shapes]:
        rc = shape(B, T, H, D, [int(p) for p in args.parts.split(",")])
        torch.cuda.empty_cache()
        if rc:
            return rc
    return 0


if __name__ == "__main__":
    sys.exit(main())
