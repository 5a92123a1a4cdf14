"""Markdown tables from grad_errors.py's JSON lines.

python benchmarks/cpu/bf16_vs_fla/tables.py impls FILE...   worst error / bound per impl, regime and gradient,
                                                             the paired triton_chunk / fla ratios, the failures
python benchmarks/cpu/bf16_vs_fla/tables.py sites FILE...   the rounding study (impl ``sites``), one row a run
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from typing import Any

from site_copy import SITES

BOUND = 9e-3  # correctness/tolerances.py: TOLERANCES["bf16"]["gradient"]
GRADS = ("q", "k", "v", "g", "beta", "initial_state")


def _rows(paths: list[str]) -> list[dict[str, Any]]:
    return [json.loads(line) for p in paths for line in open(p) if line.startswith("{")]


def impls_table(rows: list[dict[str, Any]]) -> None:
    """Per (shape, rounding): worst error / BOUND over seeds and both initial-state variants; paired ratios."""
    worst: dict[tuple, list] = defaultdict(list)
    for r in rows:
        for g in GRADS:
            if g in r["err"]:
                worst[(r["shape"], r["round"], r["impl"], r["regime"], g)].append((r["err"][g], r["seed"], r["h0"]))
    for shape, rnd in sorted({(r["shape"], r["round"]) for r in rows}):
        mine = [r for r in rows if r["shape"] == shape and r["round"] == rnd]
        seeds = sorted({r["seed"] for r in mine})
        print(f"\n{shape}, casts {rnd}, seeds {','.join(map(str, seeds))}: worst rel_fro / {BOUND:g}\n")
        print("| impl | regime | " + " | ".join(f"grad:{g}" for g in GRADS) + " |")
        print("|---|---|" + "---|" * len(GRADS))
        for impl in ("triton_chunk", "fla", "torch_chunk"):
            for reg in ("typical", "long", "strong"):
                cells = [worst.get((shape, rnd, impl, reg, g)) for g in GRADS]
                if any(cells):
                    text = " | ".join(f"{max(c)[0] / BOUND:.2f}" if c else "-" for c in cells)
                    print(f"| {impl} | {reg} | {text} |")
        pairs: dict[tuple, dict] = defaultdict(dict)
        for r in mine:
            pairs[(r["seed"], r["regime"], r["h0"])][r["impl"]] = r["err"]
        ratios = defaultdict(list)
        for d in pairs.values():
            if "triton_chunk" in d and "fla" in d:
                for g in GRADS:
                    if g in d["fla"]:
                        ratios[g].append(d["triton_chunk"][g] / d["fla"][g])
        if ratios:
            print("\ntriton_chunk / fla on identical inputs, median [min, max]: " + "; ".join(
                f"{g} {statistics.median(v):.2f} [{min(v):.2f}, {max(v):.2f}]" for g, v in ratios.items()))  # fmt: skip
        over = [
            (impl, reg, g, e / BOUND, s, h0)
            for (sh, rd, impl, reg, g), v in worst.items()
            if (sh, rd) == (shape, rnd)
            for e, s, h0 in v
            if e > BOUND
        ]
        if over:
            print("\nover the bound: " + "; ".join(
                f"{i} {r} grad:{g} {x:.2f}x (seed {s}{', h0' if h else ''})"
                for i, r, g, x, s, h in sorted(over, key=lambda t: -t[3])))  # fmt: skip


def sites_table(rows: list[dict[str, Any]]) -> None:
    """One row per run of impl ``sites``: which sites round to bf16, and the errors / BOUND it gives."""
    runs = [r for r in rows if r["impl"] == "sites"]
    if not runs:
        return
    r0 = runs[0]
    print(f"\n{r0['shape']}, seed {r0['seed']}, {r0['regime']}, initial state {r0['h0']}: rel_fro / {BOUND:g}\n")
    print("| sites rounded to bf16 | grad:g | grad:initial_state | grad:k | grad:beta |")
    print("|---|---|---|---|---|")
    for r in runs:
        off = [s for s in r["sites_off"].split(",") if s]
        if not off:
            label = "all (= triton_chunk)"
        elif len(off) == len(SITES):
            label = "none (input and output casts only)"
        elif len(off) == len(SITES) - 1:
            label = "only " + next(s for s in SITES if s not in off)
        else:
            label = "all but " + ", ".join(off)
        e = r["err"]
        print(f"| {label} | " + " | ".join(f"{e[k] / BOUND:.2f}" for k in ("g", "initial_state", "k", "beta")) + " |")


if __name__ == "__main__":
    kind, paths = sys.argv[1], sys.argv[2:]
    {"impls": impls_table, "sites": sites_table}[kind](_rows(paths))
