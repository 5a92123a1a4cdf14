"""The pair work of SDM's Triton Phase 1 and its backward per stream-chunk, all pairs against slot runs, counted (not
timed) on the flagship gate's slot draw: the figures behind the expected saving of ``triton_chunk.PHASE1 = "sort"``
(benchmarks/NOTES.md, section 6).

All pairs (triton_chunk.slot_decay_kernel, gram_kernel; triton_chunk_bwd.gather_weights_kernel, gram_bwd_kernel,
decay_bwd_kernel): each program holds 32 row entries and compares them with every column block of 32 entries,
doing a block's loads and exponentials only where some pair in it shares a slot; the figures are the compared pairs
and the 32 x 32 blocks that do the work. Slot runs (phase1_sorted.run_decay_kernel, run_gram_kernel;
phase1_sorted_bwd's three kernels): each program holds 32 sorted positions and walks as many steps as its longest
run, one entry a lane a step; the figure is the lane steps (programs x 32 x steps), each a few loads and at most a
few exponentials. The runs come from phase1_sorted.sort_runs on the drawn slots.

Usage::

    python benchmarks/cpu/sdm_run_walks.py [--chunks 8] [--S 65536] [--C 64] [--W 64] [--R 64] [--seed 0]
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from sdm_slot_collisions import distinct_slots

from deltabench.kernels.sdm.triton.phase1_sorted import sort_runs

BLOCK = 32  # entries a program holds, and entries a column block, in both forms


def hit_blocks(rows: np.ndarray, cols: np.ndarray) -> int:
    """32 x 32 blocks of (row entry, column entry) pairs in which some pair shares a slot."""
    nr, nc = -(-len(rows) // BLOCK), -(-len(cols) // BLOCK)
    rb = np.repeat(np.arange(nr), BLOCK)[: len(rows)]
    cb = np.repeat(np.arange(nc), BLOCK)[: len(cols)]
    col_of = {}
    for s, b in zip(cols.tolist(), cb.tolist(), strict=True):
        col_of.setdefault(s, set()).add(b)
    hits = set()
    for s, b in zip(rows.tolist(), rb.tolist(), strict=True):
        hits.update((b, c) for c in col_of.get(s, ()))
    return len(hits)


def chunk_work(s_w: np.ndarray, s_r: np.ndarray, C: int) -> dict[str, float]:
    """One chunk's pair work (slots ``[E]`` and ``[P]``, token-major): see the module docstring."""
    E, P = len(s_w), len(s_r)
    runs = sort_runs(torch.from_numpy(s_w).view(1, 1, E), torch.from_numpy(s_r).view(1, 1, P), C)
    length = (runs.end - runs.start).view(-1).numpy()
    steps = sum(int(length[i : i + BLOCK].max()) for i in range(0, E + P, BLOCK))
    both = np.concatenate([s_w, s_r])
    return {
        "pairs_compared": float((E + P) * (E + P)),
        "pairs_hit_blocks": float(hit_blocks(both, both)),
        "runs_lane_steps": float(BLOCK * steps),
        "runs_longest": float(length.max()),
    }


def main(argv: list[str] | None = None) -> int:
    """Print the mean and the maximum of each figure over `--chunks` random chunks, per kernel of either form."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--S", type=int, default=65536)
    ap.add_argument("--C", type=int, default=64)
    ap.add_argument("--W", type=int, default=64)
    ap.add_argument("--R", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    rows = [
        chunk_work(
            distinct_slots(rng, args.C, args.W, args.S).ravel(),
            distinct_slots(rng, args.C, args.R, args.S).ravel(),
            args.C,
        )
        for _ in range(args.chunks)
    ]
    E, P = args.C * args.W, args.C * args.R
    print(f"S={args.S} C={args.C} W={args.W} R={args.R}, {args.chunks} chunks (E + P = {E + P} entries a chunk)")
    print("  per kernel (rows x columns, both forms: writes and reads against writes and reads, at most)")
    for name in rows[0]:
        vals = np.array([r[name] for r in rows])
        print(f"  {name:18s} mean {vals.mean():14.1f}  max {vals.max():14.1f}")
    mean = {n: np.mean([r[n] for r in rows]) for n in rows[0]}
    print(f"  pairs compared / run lane steps: {mean['pairs_compared'] / mean['runs_lane_steps']:.0f}x")
    hit_lanes = mean["pairs_hit_blocks"] * BLOCK**2
    print(f"  pair lanes in hit blocks / run lane steps: {hit_lanes / mean['runs_lane_steps']:.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
