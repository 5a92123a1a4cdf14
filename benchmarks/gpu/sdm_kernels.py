"""GPU bench of deltabench's Triton SDM (kernels/sdm/triton/triton_chunk.py) beside the chunked PyTorch reference.

One process, three stages, each in its own try/except so that one failing stage (an OOM, a compile error) is named
and the others still run:

1. check (small shape, fp32): ``sdm_triton_chunk`` against ``sdm_torch_chunk`` on y, the final bank and every
   gradient (random cotangents on both outputs), and bitwise equality of two Triton fwd+bwd calls;
2. time (``triton.testing.do_bench`` median) at the flagship layer shape of the issue (H=2, D=1024, S=65536,
   W=R=64, C=64, B=1) for each T of ``--tokens`` (default 8192): Triton and the PyTorch reference, fwd and fwd+bwd,
   with the peak memory of one call (``torch.cuda.max_memory_allocated``);
3. the table.

The inputs (k_val, q_val, v, beta) are bf16; g and the bank are float32 (both impls keep a float32 bank). Slots are
drawn per token without repeats (slot n of a token uniform in the n-th of W equal blocks of the bank), weights
L2-normalised, as in ``references.sdm.make_inputs`` (which draws from all S and is too slow at S = 65536).

Usage::

    python benchmarks/gpu/sdm_kernels.py [--tokens 1024,8192] [--budget-s 420] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
import triton
from triton.testing import do_bench

from deltabench.kernels.sdm import sdm_torch_chunk
from deltabench.kernels.sdm.triton.triton_chunk import sdm_triton_chunk
from deltabench.references.sdm import make_inputs

FLOATS = ("k_val", "q_val", "v", "g", "beta", "initial_bank")
FLAGSHIP = {"H": 2, "D": 1024, "S": 65536, "W": 64, "R": 64, "C": 64, "B": 1}
CHECK_BOUND = 1e-4  # fp32 Triton vs fp32 PyTorch, relative Frobenius error
IMPLS: dict[str, Callable] = {"triton_chunk": sdm_triton_chunk, "torch_chunk": sdm_torch_chunk}
ROWS: list[dict] = []


def say(msg: str) -> None:
    """Print at once (a remote run returns the tail of stdout)."""
    print(msg, flush=True)


def rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative Frobenius error; NaN or Inf anywhere gives inf."""
    x, ref = x.double(), ref.double()
    if not torch.isfinite(x).all():
        return float("inf")
    return ((x - ref).norm() / ref.norm().clamp_min(1e-300)).item()


def fwd_bwd(fn: Callable, x: dict, C: int, grads: bool, seed: int = 7) -> dict[str, torch.Tensor]:
    """``fn(**x)``; with `grads`, backward of seeded random cotangents on y and the bank. Returns outputs and grads."""
    leaves = dict(x)
    if grads:
        for n in FLOATS:
            if n in leaves:
                leaves[n] = leaves[n].detach().clone().requires_grad_(True)
    y, bank = fn(**leaves, chunk_size=C)
    out = {"y": y.detach(), "bank": bank.detach()}
    if grads:
        gen = torch.Generator(device=y.device).manual_seed(seed)
        dy = torch.randn(y.shape, generator=gen, device=y.device, dtype=y.dtype)
        dbank = torch.randn(bank.shape, generator=gen, device=y.device) * 0.1
        torch.autograd.backward((y, bank), (dy, dbank))
        out.update({f"d{n}": leaves[n].grad for n in FLOATS if n in leaves})
    return out


def check() -> None:
    """Stage 1: Triton against the PyTorch reference at a small shape, and Triton against itself bit for bit."""
    for regime in ("typical", "collisions", "key_weighted"):
        x = make_inputs(1, 300, 2, 512, 64, 16, 16, device="cuda", seed=1, regime=regime, initial_bank=True)
        ref = fwd_bwd(sdm_torch_chunk, x, 64, grads=True)
        ours = fwd_bwd(sdm_triton_chunk, x, 64, grads=True)
        again = fwd_bwd(sdm_triton_chunk, x, 64, grads=True)
        errs = {n: rel(ours[n], ref[n]) for n in ref}
        same = all(torch.equal(ours[n], again[n]) for n in ours)
        ok = same and all(e < CHECK_BOUND for e in errs.values())
        say(
            f"check {regime}: {'PASS' if ok else 'FAIL'} bitwise={same} "
            + " ".join(f"{n}={e:.1e}" for n, e in errs.items())
        )


def flagship_inputs(T: int, seed: int = 0) -> dict:
    """Flagship-shape inputs on the GPU (bf16 floats, float32 g, no initial bank)."""
    B, H, S, D, W, R = (FLAGSHIP[k] for k in "BHSDWR")
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def slots(n: int) -> torch.Tensor:
        block = S // n
        return torch.arange(n, device="cuda") * block + torch.randint(block, (B, T, H, n), generator=gen, device="cuda")

    def unit(n: int) -> torch.Tensor:
        x = torch.randn(B, T, H, n, generator=gen, device="cuda")
        return (x / x.norm(dim=-1, keepdim=True)).bfloat16()

    return {
        "k_idx": slots(W),
        "k_val": unit(W),
        "q_idx": slots(R),
        "q_val": unit(R),
        "v": torch.randn(B, T, H, D, generator=gen, device="cuda").bfloat16(),
        "g": torch.nn.functional.logsigmoid(torch.randn(B, T, H, generator=gen, device="cuda")),
        "beta": torch.sigmoid(torch.randn(B, T, H, generator=gen, device="cuda")).bfloat16(),
        "num_slots": S,
    }


def time_one(name: str, mode: str, T: int, x: dict) -> None:
    """Stage 2 for one (impl, mode, T): peak memory of one call, then the do_bench median."""
    row = {"impl": name, "mode": mode, "T": T, "ms": None, "peak_gib": None, "note": ""}
    ROWS.append(row)
    fn = IMPLS[name]
    grads = mode == "fwd+bwd"
    try:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        start = time.perf_counter()
        fwd_bwd(fn, x, FLAGSHIP["C"], grads)
        torch.cuda.synchronize()
        first = time.perf_counter() - start
        row["peak_gib"] = (torch.cuda.max_memory_allocated() - base) / 2**30
        if first > 20.0:  # too slow to repeat inside a short lease: the first call (compilation included)
            row["ms"], row["note"] = first * 1e3, "very slow: one call, compilation included"
        elif first < 2.0:
            row["ms"] = do_bench(lambda: fwd_bwd(fn, x, FLAGSHIP["C"], grads), warmup=1, rep=max(20, int(first * 5e3)))
        else:  # do_bench's own estimate alone would take 5 more calls: two timed calls, the faster one
            times = []
            for _ in range(2):
                start = time.perf_counter()
                fwd_bwd(fn, x, FLAGSHIP["C"], grads)
                torch.cuda.synchronize()
                times.append(time.perf_counter() - start)
            row["ms"], row["note"] = min(times) * 1e3, "slow: best of 2 calls, not do_bench"
    except torch.cuda.OutOfMemoryError as exc:
        row["note"] = f"out of memory: {str(exc).splitlines()[0][:100]}"
    except Exception as exc:  # one failing stage is reported, the rest still run
        row["note"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:100] if str(exc) else ''}"
        traceback.print_exc()
    say(f"time {name} {mode} T={T}: ms={row['ms']} peak_gib={row['peak_gib']} {row['note']}")


def main() -> int:
    """Run the stages; exit 2 with one line when no CUDA device is there."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default="8192", help="comma-separated T values at the flagship shape")
    parser.add_argument("--budget-s", type=float, default=1e9, help="skip timings that start after this many s")
    parser.add_argument("--skip-check", action="store_true")
    parser.add_argument("--out", type=Path, default=None, help="write sdm_kernels.json there")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("sdm_kernels: no CUDA device here (this bench runs on a GPU)", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    say(f"device {torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}")
    if not args.skip_check:
        try:
            check()
        except Exception as exc:
            say(f"check: FAILED to run: {type(exc).__name__}: {exc}")
            traceback.print_exc()
    for T in (int(t) for t in args.tokens.split(",")):
        try:
            x = flagship_inputs(T)
        except Exception as exc:
            say(f"inputs T={T}: {type(exc).__name__}: {exc}")
            continue
        for name in IMPLS:
            for mode in ("fwd", "fwd+bwd"):
                if time.perf_counter() - t0 > args.budget_s:
                    ROWS.append({"impl": name, "mode": mode, "T": T, "ms": None, "peak_gib": None, "note": "skipped"})
                    continue
                time_one(name, mode, T, x)
        del x
    say("\n| impl | mode | T | ms (median) | peak GiB | note |\n|---|---|---|---|---|---|")
    for r in ROWS:
        ms = "" if r["ms"] is None else f"{r['ms']:.1f}"
        gib = "" if r["peak_gib"] is None else f"{r['peak_gib']:.2f}"
        say(f"| {r['impl']} | {r['mode']} | {r['T']} | {ms} | {gib} | {r['note']} |")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "sdm_kernels.json").write_text(json.dumps({"shape": FLAGSHIP, "rows": ROWS}, indent=1))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    sys.exit(main())
