"""Where sdm's Triton forward and backward spend their time at the flagship shape: one process, each kernel's CUDA
time under ``torch.profiler``, then the forward and fwd+bwd at other launch choices, then the chunked PyTorch
reference beside them.

At B1 x 8K (H=2, D=1024, S=65536, W=R=64, C=64, bf16) this prints, for one fwd+bwd call, every kernel's total and
per-call CUDA time (largest first), so that the next change goes where the time is; then the ``do_bench`` medians of
the forward and of fwd+bwd at each ``--precision`` (tl.dot's input precision in the update and the backward's walk,
triton_chunk_bwd.DOT_PRECISION: IEEE float32 on CUDA cores, or TF32 x 3 on tensor cores) and ``--block-d`` (the
bank columns per program of the update and of the walk: more programs at narrower blocks, the same arithmetic per
column), each run's output and bank checked against the first's (float32 rounding apart); last, the chunked
PyTorch reference (``sdm_torch_chunk``, the suite's baseline) by the same timer, forward and fwd+bwd, with
Triton's speed-up over it (``--no-torch`` skips it: ~2 s a fwd+bwd call). ``--phase1`` names the pair work's forms
to profile and time (triton_chunk.PHASE1: "pairs", every entry pair of a chunk; "sort", inside slot runs), each
checked against the first.

Usage::

    python benchmarks/gpu/sdm_profile.py [--tokens 8192] [--block-d 32,16] [--precision ieee,tf32x3] \
        [--phase1 pairs,sort] [--no-torch]
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
    ap.add_argument(
        "--precision", default="ieee,tf32x3", help="tl.dot input precisions of the update and the walk to try"
    )
    ap.add_argument("--phase1", default="pairs", help="triton_chunk.PHASE1 forms to try: pairs, sort")
    ap.add_argument("--no-torch", action="store_true", help="skip the chunked PyTorch reference's timings")
    args = ap.parse_args(argv)
    precisions = [p for p in args.precision.split(",") if p]
    unknown = sorted(set(precisions) - {"ieee", "tf32", "tf32x3"})
    if unknown or not precisions:
        ap.error(f"--precision {args.precision!r}: use ieee, tf32 or tf32x3 (comma-separated)")
    forms = [f for f in args.phase1.split(",") if f]
    if not forms or set(forms) - {"pairs", "sort"}:
        ap.error(f"--phase1 {args.phase1!r}: use pairs or sort (comma-separated)")
    if not torch.cuda.is_available():
        print("sdm_profile.py: needs a CUDA device", file=sys.stderr)
        return 2
    from sdm_kernels import FLAGSHIP, flagship_inputs, fwd_bwd
    from torch.profiler import ProfilerActivity, profile
    from triton.testing import do_bench

    from deltabench.kernels.sdm import sdm_torch_chunk
    from deltabench.kernels.sdm.triton import triton_chunk, triton_chunk_bwd

    C, T = FLAGSHIP["C"], args.tokens
    x = flagship_inputs(T)
    kept = triton_chunk._BLOCK_D, triton_chunk_bwd.BLOCK_D, triton_chunk_bwd.DOT_PRECISION, triton_chunk.PHASE1
    for form in forms:
        triton_chunk.PHASE1 = form
        fwd_bwd(triton_chunk.sdm_triton_chunk, x, C, grads=True)  # compiles
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fwd_bwd(triton_chunk.sdm_triton_chunk, x, C, grads=True)
            torch.cuda.synchronize()
        print(f"sdm triton_chunk fwd+bwd, PHASE1 {form}, flagship B1-T{T}, one call, CUDA time by kernel:")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=60))
    triton_chunk.PHASE1 = kept[3]

    widths = [int(w) for w in args.block_d.split(",") if w]
    medians: dict[str, float] = {}
    first: dict[str, torch.Tensor] | None = None
    try:
        for form, precision, width in [(f, p, w) for f in forms for p in precisions for w in widths]:
            triton_chunk._BLOCK_D = triton_chunk_bwd.BLOCK_D = width
            triton_chunk_bwd.DOT_PRECISION = precision
            triton_chunk.PHASE1 = form
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
                f"  {form:5s} {precision:6s} block_d {width:3d}: {programs:4d} column slices, fwd {fwd_ms:8.2f} ms,"
                f" fwd+bwd {both_ms:8.2f} ms, vs first {worst:.1e}"
            )
    finally:
        triton_chunk._BLOCK_D, triton_chunk_bwd.BLOCK_D, triton_chunk_bwd.DOT_PRECISION, triton_chunk.PHASE1 = kept
    if not args.no_torch and medians:
        # ~8 calls each (do_bench: one, five to estimate, one warm-up, one timed at these 1 ms budgets)
        torch_fwd = do_bench(lambda: sdm_torch_chunk(**x, chunk_size=C), warmup=1, rep=1, return_mode="median")
        both = lambda: fwd_bwd(sdm_torch_chunk, x, C, grads=True)
        torch_both = do_bench(both, warmup=1, rep=1, return_mode="median")
        print(
            f"  torch_chunk: fwd {torch_fwd:8.2f} ms, fwd+bwd {torch_both:8.2f} ms; triton_chunk at block_d"
            f" {widths[0]}, {precisions[0]}, PHASE1 {forms[0]}, is {torch_fwd / medians['fwd']:.1f}x and"
            f" {torch_both / medians['fwd+bwd']:.1f}x faster"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
