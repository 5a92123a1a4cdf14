"""Packed variable-length batches: the lengths of the sequences packed along T, typed or drawn.

A case with ``seqlens`` has B = 1 and the sequences concatenated along T (FLA's ``cu_seqlens`` convention,
references/contract.CU_SEQLENS). The lengths are typed (``17,64,1,218``) or drawn from a named distribution
(``lognormal(mean=2048, sigma=1.0, total=32768, seed=0)``), which is recorded with the lengths it gave.
"""

from __future__ import annotations

import math
import random
import re

from .errors import BadInput

__all__ = ["DISTRIBUTIONS", "cu_seqlens", "draw_seqlens", "parse_seqlens", "prefix_seqlens", "seqlens_problem"]

DISTRIBUTIONS = ("lognormal",)
_CALL = re.compile(r"\s*([a-z_]+)\s*\((.*)\)\s*")


def parse_seqlens(text: str) -> tuple[int, ...]:
    """Read ``17,64,1,218`` into lengths; BadInput names a part that is not a positive integer."""
    parts = [p.strip() for p in str(text).split(",")]
    if not parts or any(not p.isdigit() or int(p) < 1 for p in parts):
        raise BadInput(f"--seqlens {text!r}: expected positive integers separated by commas, e.g. 17,64,1,218")
    return tuple(int(p) for p in parts)


def seqlens_problem(seqlens: tuple[int, ...], T: int, B: int) -> str | None:
    """Why `seqlens` cannot pack a batch of `B` rows of `T` tokens, or None."""
    if not seqlens:
        return "seqlens is empty: give at least one length"
    if any(n < 1 for n in seqlens):
        return f"seqlens {list(seqlens)}: every length must be at least 1"
    if B != 1:
        return f"packed sequences (seqlens) take B=1, got B={B}"
    if sum(seqlens) != T:
        return f"seqlens sum to {sum(seqlens)}, not T={T}"
    return None


def prefix_seqlens(seqlens: tuple[int, ...], T: int) -> tuple[int, ...]:
    """The lengths of the first `T` tokens of the packed batch: the sequences they hold, the last one cut."""
    if sum(seqlens) < T:
        raise BadInput(f"T={T} is longer than the packed sequences ({sum(seqlens)} tokens)")
    out: list[int] = []
    left = T
    for n in seqlens:
        if left <= 0:
            break
        out.append(min(n, left))
        left -= out[-1]
    return tuple(out)


def cu_seqlens(seqlens: tuple[int, ...]) -> list[int]:
    """The offsets ``[0, n0, n0 + n1, ..., T]`` of the packed sequences (FLA's cu_seqlens, N + 1 entries)."""
    out = [0]
    for n in seqlens:
        out.append(out[-1] + n)
    return out


def _arguments(name: str, text: str) -> dict[str, float]:
    args: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        key, eq, value = part.partition("=")
        try:
            args[key.strip()] = float(value)
        except ValueError:
            eq = ""
        if not eq:
            raise BadInput(f"{name}(...): expected key=number arguments, got {part!r}")
    return args


def draw_seqlens(spec: str, T: int | None = None) -> tuple[tuple[int, ...], str]:
    """Lengths drawn from `spec` (``lognormal(mean=2048, sigma=1.0, total=32768, seed=0)``) and the spec in its one
    spelling (for shape ids). ``total`` defaults to `T` and must equal it when both are given.

    The lognormal's ``mean`` is the mean length (its log-mean is ``ln(mean) - sigma^2 / 2``); lengths are rounded,
    at least 1, drawn until they fill ``total`` tokens, the last one cut to fit.
    """
    m = _CALL.fullmatch(str(spec))
    if not m or m.group(1) not in DISTRIBUTIONS:
        raise BadInput(
            f"seqlens {spec!r}: expected a list of lengths or a distribution such as "
            "lognormal(mean=2048, sigma=1.0, total=32768, seed=0)"
        )
    name, args = m.group(1), _arguments(m.group(1), m.group(2))
    unknown = sorted(set(args) - {"mean", "sigma", "total", "seed"})
    if unknown or "mean" not in args:
        raise BadInput(f"{name}(...) takes mean, sigma, total and seed (mean required), got {', '.join(sorted(args))}")
    total = int(args.get("total", T or 0))
    if total < 1 or (T is not None and total != T):
        raise BadInput(f"{spec}: total={total} must be at least 1 and equal the shape's T={T}")
    mean, sigma, seed = args["mean"], args.get("sigma", 1.0), int(args.get("seed", 0))
    if mean < 1 or sigma < 0:
        raise BadInput(f"{spec}: mean must be at least 1 and sigma at least 0")
    rng = random.Random(seed)
    mu = math.log(mean) - sigma * sigma / 2
    lengths: list[int] = []
    left = total
    while left > 0:
        n = min(max(1, round(rng.lognormvariate(mu, sigma))), left)
        lengths.append(n)
        left -= n
    canonical = f"{name}(mean={mean:g},sigma={sigma:g},total={total},seed={seed})"
    return tuple(lengths), canonical
