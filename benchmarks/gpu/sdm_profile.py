"""Where sdm's Triton forward and backward spend their time at the flagship shape: one process, each kernel's CUDA
time under ``torch.profiler``, then the column block of the forward's update kernel and of the backward's walk
tried at other widths.

At B1 x 8K (H=2, D=1024, S=65536, W=R=64, C=64, bf16) the forward took 125 ms and fwd+bwd 497 ms on the H200
(2026-12-01), against a floor of a few ms: the Gram matrices and the solve run for every chunk at once, the step
kernel once per chunk (128 launches) on B*H x D/_BLOCK_D programs (64 at the flagship: half the H200's SMs). This
prints, for one fwd+bwd call, every kernel's total and per-call CUDA time (largest first), so that the next change
goes where the time is; then the ``do_bench`` medians of the forward and of fwd+bwd at each ``--block-d`` (the bank
columns per program of the update kernel and of the backward's step: more programs at narrower blocks; the same
arithmetic per column, so correctness does not change; each width's output and bank are checked against the
first's within float32 rounding). Last, the chunked PyTorch reference (``sdm_torch_chunk``, the suite's baseline) by
the same timer, forward and fwd+bwd, with Triton's speed-up over it (``--no-torch`` skips it: ~4 s a call).

Usage::

    python benchmarks/gpu/sdm_profile.py [--tokens 8192] [--block-d 32,16] [--no-torch]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))


def main(argv: list[str] | None = None) -> int:
    """Profile one flagship fwd+bwd call, then time the forward at each step-kernel column block. Exit 2 without a
    CUDA device."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--block-d", default="32,16", help="column blocks to try (16 or more: tl.dot's least)")
    ap.add_argument("--no-torch", action="store_true", help="skip the chunked PyTorch reference's timings")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("sdm_profile.py: needs a CUDA device", file=sys.stderr)
        return 2
    from deltabench.kernels.sdm import sdm_torch_chunk
    from deltabench.kernels.sdm.triton import triton_chunk, triton_chunk_bwd
    from sdm_kernels import FLAGSHIP, flagship_inputs, fwd_bwd
    from torch.profiler import ProfilerActivity, profile
    from triton.testing import do_bench

    C, T = FLAGSHIP["C"], args.tokens
    x = flagship_inputs(T)
    fwd_bwd(triton_chunk.sdm_triton_chunk, x, C, grads=True)  # compiles
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fwd_bwd(triton_chunk.sdm_triton_chunk, x, C, grads=True)
        torch.cuda.synchronize()
    print(f"sdm triton_chunk fwd+bwd, flagship B1-T{T}, one call, CUDA time by kernel:")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=60))

    widths = [int(w) for w in args.block_d.split(",") if w]
    medians: dict[str, float] = {}
    kept = triton_chunk._BLOCK_D, triton_chunk_bwd.BLOCK_D
    first: dict[str, torch.Tensor] | None = None
    try:
        for width in widths:
            triton_chunk._BLOCK_D = triton_chunk_bwd.BLOCK_D = width
            out = fwd_bwd(triton_chunk.sdm_triton_chunk, x, C, grads=False)
            if first is None:
                first = out
            worst = max(
                ((out[n].float() - first[n].float()).norm() / first[n].float().norm()).item() for n in ("y", "bank")
            )
            fwd_ms = do_bench(lambda: triton_chunk.sdm_triton_chunk(**x, chunk_size=C), return_mode="median")
            both_ms = do_bench(lambda: fwd_bwd(triton_chunk.sdm_triton_chunk, x, C, grads=True), return_mode="median")
            medians.setdefault("fwd", fwd_ms)
            medians.setdefault("fwd+bwd", both_ms)
            programs = FLAGSHIP["B"] * FLAGSHIP["H"] * -(-FLAGSHIP["D"] // width)
            print(
                f"  block_d {width:3d}: {programs:4d} column slices, fwd {fwd_ms:8.2f} ms, fwd+bwd {both_ms:8.2f} ms,"
                f" vs first {worst:.1e}"
            )
    finally:
        triton_chunk._BLOCK_D, triton_chunk_bwd.BLOCK_D = kept
    if not args.no_torch and medians:
        # ~8 calls each (do_bench: one, five to estimate, one warm-up, one timed at these 1 ms budgets)
        torch_fwd = do_bench(lambda: sdm_torch_chunk(**x, chunk_size=C), warmup=1, rep=1, return_mode="median")
        both = lambda: fwd_bwd(sdm_torch_chunk, x, C, grads=True)
        torch_both = do_bench(both, warmup=1, rep=1, return_mode="median")
        print(
            f"  torch_chunk: fwd {torch_fwd:8.2f} ms, fwd+bwd {torch_both:8.2f} ms; triton_chunk at block_d"
            f" {widths[0]} is {torch_fwd / medians['fwd']:.1f}x and {torch_both / medians['fwd+bwd']:.1f}x faster"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
