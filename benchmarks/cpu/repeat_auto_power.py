"""How often ``run --repeat auto`` misses a planted slowdown under a look schedule, by simulation.

A worker process on the shared two-core CI machine sits in a fast or a slow state for its whole life; its best time
is the fast level with a little jitter, or that times 1.05-1.40 when slow. This draws such levels for a base and a
head ``factor`` times slower, applies the gate's within-run test (:func:`deltabench.regression.noise.
permutation_bound` on the studentised faster-half difference) at each look of a schedule at alpha / looks, and
counts the pairs no look caught::

    python benchmarks/cpu/repeat_auto_power.py --factor 1.25 --pairs 40
"""

from __future__ import annotations

import argparse

import numpy as np

from deltabench.regression.noise import permutation_bound, studentised_difference


def draw(rng: np.random.Generator, n: int, scale: float, p_slow: float, jitter: float) -> np.ndarray:
    """`n` repetitions' best times: fast with |N(0, jitter)| added, slow (probability `p_slow`) 5-40% above."""
    x = 1.0 + np.abs(rng.normal(0.0, jitter, n))
    slow = rng.random(n) < p_slow
    return np.where(slow, x * (1.0 + rng.uniform(0.05, 0.40, n)), x) * scale


def misses(schedule: list[int], factor: float, pairs: int, p_slow: float, jitter: float, alpha: float) -> int:
    """Planted pairs that no look of `schedule` called slower."""
    rng = np.random.default_rng(0)
    missed = 0
    for _ in range(pairs):
        base, head = draw(rng, schedule[-1], 1.0, p_slow, jitter), draw(rng, schedule[-1], factor, p_slow, jitter)
        for n in schedule:
            b, h = np.log(base[:n]), np.log(head[:n])
            d, _ = studentised_difference(b, h)
            if float(d) > permutation_bound(tuple(b), tuple(h), alpha / len(schedule)):
                break
        else:
            missed += 1
    return missed


def main() -> None:
    """Print the misses of each schedule under two machine states (quiet-ish and loaded)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--factor", type=float, default=1.25)
    ap.add_argument("--pairs", type=int, default=40)
    ap.add_argument("--alpha", type=float, default=0.005)
    args = ap.parse_args()
    for p_slow, jitter in ((0.4, 0.01), (0.5, 0.03)):
        for schedule in ([6, 10], [6, 12, 20]):
            m = misses(schedule, args.factor, args.pairs, p_slow, jitter, args.alpha)
            print(f"slow processes {p_slow:.0%}, jitter {jitter:.0%}, looks {schedule}: missed {m}/{args.pairs}")


if __name__ == "__main__":
    main()
