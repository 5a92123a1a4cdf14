"""How sparse one SDM chunk's slot structure is at a given shape: the figures behind the flagship's Phase-1 and
Phase-2 cost estimates (benchmarks/NOTES.md, section 6).

Per chunk of C tokens, each token writing W and reading R distinct slots drawn uniformly from S (the flagship
gate's draw): the distinct write slots (rows a chunk's update writes), the distinct write-or-read slots (rows the
walk rewrites), the write-write pairs of different tokens sharing a slot (the terms of A), the cells of A they hit,
the read-write pairs at or before the read's token (the terms of QK), the largest slot group and the share of write
entries whose slot no other write entry of the chunk has. The last line gives the nonzero share of the dense
[entries, C] weight matrices a one-hot formulation multiplies (write entries over E x C).

Usage::

    python benchmarks/cpu/sdm_slot_collisions.py [--chunks 64] [--S 65536] [--C 64] [--W 64] [--R 64] [--seed 0]
"""

from __future__ import annotations

import argparse

import numpy as np


def distinct_slots(rng: np.random.Generator, C: int, n: int, S: int) -> np.ndarray:
    """``[C, n]`` slots, each row n distinct draws from ``range(S)``."""
    return np.stack([rng.choice(S, n, replace=False) for _ in range(C)])


def chunk_stats(k_idx: np.ndarray, q_idx: np.ndarray) -> dict[str, float]:
    """The slot structure of one chunk (``k_idx [C, W]``, ``q_idx [C, R]``): see the module docstring."""
    C, W = k_idx.shape
    R = q_idx.shape[1]
    slot_w, tok_w = k_idx.ravel(), np.repeat(np.arange(C), W)
    slot_r, tok_r = q_idx.ravel(), np.repeat(np.arange(C), R)
    groups, sizes = np.unique(slot_w, return_counts=True)
    # A's terms: every pair of write entries of one slot (their tokens differ: a token's slots are distinct)
    order = np.lexsort((tok_w, slot_w))
    s_sorted, t_sorted = slot_w[order], tok_w[order]
    cells = set()
    for k in range(1, int(sizes.max())):
        same = s_sorted[k:] == s_sorted[:-k]
        cells.update(zip(t_sorted[k:][same].tolist(), t_sorted[:-k][same].tolist(), strict=True))
    # QK's terms: for each read entry, the write entries of its slot at its token or before
    keys = np.sort(slot_w.astype(np.int64) * C + tok_w)
    base = slot_r.astype(np.int64) * C
    rw = np.searchsorted(keys, base + tok_r, side="right") - np.searchsorted(keys, base, side="left")
    return {
        "distinct_w": float(len(groups)),
        "distinct_wr": float(len(np.unique(np.concatenate([slot_w, slot_r])))),
        "ww_pairs": float((sizes * (sizes - 1) // 2).sum()),
        "A_cells": float(len(cells)),
        "rw_pairs": float(rw.sum()),
        "max_group": float(sizes.max()),
        "singleton_w": float((sizes == 1).sum() / slot_w.size),
    }


def main(argv: list[str] | None = None) -> int:
    """Print the mean and the maximum of each figure over `--chunks` random chunks."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--chunks", type=int, default=64)
    ap.add_argument("--S", type=int, default=65536)
    ap.add_argument("--C", type=int, default=64)
    ap.add_argument("--W", type=int, default=64)
    ap.add_argument("--R", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    rows = [
        chunk_stats(distinct_slots(rng, args.C, args.W, args.S), distinct_slots(rng, args.C, args.R, args.S))
        for _ in range(args.chunks)
    ]
    E = args.C * args.W
    print(f"S={args.S} C={args.C} W={args.W} R={args.R}, {args.chunks} chunks (E = {E} write entries a chunk)")
    for name in rows[0]:
        vals = np.array([r[name] for r in rows])
        print(f"  {name:12s} mean {vals.mean():10.3f}  max {vals.max():10.3f}")
    # A one-hot [E, C] weight matrix holds one nonzero per write entry of a written slot's group and token
    print(f"  one-hot [E, C] nonzero share: {E / (E * args.C):.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
