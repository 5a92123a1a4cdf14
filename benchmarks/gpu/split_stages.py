"""Stage-by-stage times of triton_chunk and triton_chunk_split on the GPU: checks the model behind lever 1.

Run on the GPU (a diagnostic script, not a gate: the gated, end-to-end times come from ``deltabench run``)::

    python benchmarks/gpu/split_stages.py [--shape B=8,T=4096,H=6,K=128,V=128 ...] [--out stages.json]

Times each stage alone with runners/cuda.py's timer (CUDA events, L2 flushed), bf16 inputs from
references/gdn.make_inputs: ``wy_fwd``; chunk.py's ``state_fwd`` without and with the per-chunk stores
(the forward-only and the training forward of triton_chunk); walk.py's ``state_walk``; output.py's
``chunk_output``; state.py's ``state_bwd``; local_bwd.py's ``local_bwd``. benchmarks/NOTES.md ("v1
(triton_chunk_split)") predicts: state_walk at about 0.45x state_fwd, chunk_output near its bytes
(~0.1 ms at the first shape), wy_fwd unchanged.
"""

from __future__ import annotations

import argparse
import json
import sys

SHAPES = ("B=8,T=4096,H=6,K=128,V=128", "B=4,T=8192,H=16,K=128,V=128")


def stage_closures(B: int, T: int, H: int, K: int, V: int, device: str = "cuda") -> dict:
    """Zero-argument closures, one per stage, on inputs (and upstream stage results) built once here."""
    import torch

    from deltabench.kernels.gdn.triton.local_bwd import local_bwd
    from deltabench.kernels.gdn.triton.output import chunk_output
    from deltabench.kernels.gdn.triton.state import state_bwd, state_fwd
    from deltabench.kernels.gdn.triton.walk import state_walk
    from deltabench.kernels.gdn.triton.wy import wy_fwd
    from deltabench.references.gdn import make_inputs

    x = make_inputs(B, T, H, K, V, dtype=torch.bfloat16, device=device, seed=0, initial_state=True)
    q, k, v, beta = (x[n].contiguous() for n in ("q", "k", "v", "beta"))
    g, h0 = x["g"].float().contiguous(), x["initial_state"].float().contiguous()
    scale = K**-0.5
    L, w, u = wy_fwd(k, v, g, beta)
    h, vnew, _ = state_walk(k, w, u, g, h0, True)
    do = torch.randn_like(v)
    dh, dvnew, _ = state_bwd(q, k, w, g, do, None, scale)
    return {
        "wy_fwd": lambda: wy_fwd(k, v, g, beta),
        "state_fwd (fwd only)": lambda: state_fwd(q, k, w, u, g, scale, h0, True, False),
        "state_fwd (stores h, v_new)": lambda: state_fwd(q, k, w, u, g, scale, h0, True, True),
        "state_walk": lambda: state_walk(k, w, u, g, h0, True),
        "chunk_output": lambda: chunk_output(q, k, g, h, vnew, scale),
        "state_bwd": lambda: state_bwd(q, k, w, g, do, None, scale),
        "local_bwd": lambda: local_bwd(q, k, v, g, beta, L, h, dh, vnew, dvnew, do, scale),
    }


def main() -> int:
    """Time every stage at every shape; print one line per stage; write JSON when --out is given."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", action="append", help=f"B=..,T=..,H=..,K=..,V=.. (default: {SHAPES})")
    parser.add_argument("--budget-s", type=float, default=0.5)
    parser.add_argument("--device", default="cuda", help="cuda; cpu (TRITON_INTERPRET=1) only checks the script runs")
    parser.add_argument("--out", help="write the medians here (JSON)")
    args = parser.parse_args()

    from deltabench.harness.cases import parse_shape

    if args.device == "cuda":
        from deltabench.runners.cuda import time_callable
    else:
        from deltabench.runners.cpu import time_callable

    rows = []
    for shape in args.shape or SHAPES:
        dims = parse_shape(shape)
        for stage, fn in stage_closures(*(dims[d] for d in "BTHKV"), device=args.device).items():
            stats = time_callable(fn, budget_s=args.budget_s, warmup_s=0.2)
            iqr = stats.q3_ms - stats.q1_ms
            rows.append({"shape": shape, "stage": stage, "median_ms": stats.median_ms, "iqr_ms": iqr})
            print(f"{shape:30s} {stage:28s} {stats.median_ms:8.4f} ms  IQR {iqr:.4f}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
