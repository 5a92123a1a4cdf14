"""Time and peak memory of one forward and backward of the float64 SDM oracle on the CPU.

    python benchmarks/sdm_oracle_scale.py [--dense] [--threads N] B T H S D W R

Inputs as the gate's oracle gets them: ``references.sdm.make_inputs`` (typical regime, seed 0, with an initial bank)
cast to float64, every float input requiring a gradient, random float64 cotangents on y and the final bank.
``--dense`` runs the token loop the oracle replaced (``_dense_reference`` in
tests/references/test_sdm_oracle_lean.py), which copies the whole bank twice per token. Peak memory is the
process's peak resident set (``getrusage``), printed after the inputs, after the forward and at the end.
"""

from __future__ import annotations

import argparse
import importlib.util
import resource
import time
from pathlib import Path

import torch

from deltabench.references import sdm

FLOATS = ("k_val", "q_val", "v", "g", "beta", "initial_bank")


def peak_rss_gib() -> float:
    """The process's peak resident set so far, in GiB (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def dense_reference():
    """The dense loop kept by the oracle's test module (loaded by path: tests is not a package)."""
    path = Path(__file__).resolve().parents[1] / "tests" / "references" / "test_sdm_oracle_lean.py"
    spec = importlib.util.spec_from_file_location("test_sdm_oracle_lean", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module._dense_reference


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dims", nargs=7, type=int, metavar="B T H S D W R")
    parser.add_argument("--dense", action="store_true", help="the dense loop instead of the oracle")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    B, T, H, S, D, W, R = args.dims
    fn = dense_reference() if args.dense else sdm.sdm_recurrent
    x = sdm.make_inputs(B, T, H, S, D, W, R, seed=0, regime="typical", initial_bank=True)
    x.update({n: x[n].detach().to(torch.float64).requires_grad_() for n in FLOATS})
    gen = torch.Generator().manual_seed(1)
    cot_y = torch.randn(B, T, H, D, generator=gen, dtype=torch.float64)
    cot_bank = torch.randn(B, H, S, D, generator=gen, dtype=torch.float64)
    name = f"{'dense' if args.dense else 'oracle'} B{B}-T{T}-H{H}-S{S}-D{D}-W{W}-R{R}"
    print(f"{name}, {torch.get_num_threads()} thread(s): inputs ready, peak RSS {peak_rss_gib():.2f} GiB", flush=True)
    t0 = time.perf_counter()
    y, bank = fn(**x)
    t1 = time.perf_counter()
    print(f"  forward {t1 - t0:.2f} s, peak RSS {peak_rss_gib():.2f} GiB", flush=True)
    torch.autograd.backward([y, bank], [cot_y, cot_bank])
    t2 = time.perf_counter()
    print(f"  backward {t2 - t1:.2f} s; forward + backward {t2 - t0:.2f} s, peak RSS {peak_rss_gib():.2f} GiB")


if __name__ == "__main__":
    main()
