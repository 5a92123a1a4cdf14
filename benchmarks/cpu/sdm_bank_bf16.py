"""How close sdm's torch impls (float32 bank) come to the float64 oracle at bf16, against the same impls with their
bank kept in bf16 (torch_recurrent's rounded after every token) or carried in bf16 (torch_chunk's rounded where one
chunk of 64 tokens hands it to the next): the measurement behind sdm's bf16 state bound (correctness/tolerances.py).

Runs the gate's own comparison (verify_case: every regime, with and without an initial bank) per seed and prints,
per impl, regime and check, the worst relative Frobenius error over the seeds.

    PYTHONPATH=src python benchmarks/cpu/sdm_bank_bf16.py --seeds 0-4
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from deltabench.correctness.engine import verify_case
from deltabench.harness import registry
from deltabench.harness.cases import Case
from deltabench.kernels.sdm import sdm_torch_chunk
from deltabench.kernels.sdm.torch import torch_recurrent as recurrent_module
from deltabench.references import sdm

# The CPU smoke suite's shape (sdm-smoke) and the gate tests' (tests/harness/test_sdm_gate.py).
SHAPES = ("B=1,T=100,H=2,S=256,D=32,W=8,R=8", "B=1,T=128,H=2,S=32,D=8,W=4,R=4")
CHECKS = ("output", "final_state")


@contextmanager
def bf16_bank() -> Iterator[None]:
    """torch_recurrent with its bank rounded to bf16 after every token (the bug the bound must reject)."""
    real = recurrent_module.sdm_step

    def rounded(*args: Any) -> tuple[torch.Tensor, torch.Tensor]:
        y, bank = real(*args)
        return y, bank.to(torch.bfloat16).float()

    recurrent_module.sdm_step = rounded
    try:
        yield
    finally:
        recurrent_module.sdm_step = real


def chunk_by_chunk(carry: torch.dtype) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """sdm as torch_chunk run 64 tokens at a time, the bank handed from one chunk to the next rounded to `carry` (in
    bf16: a kernel that carries its bank between chunks in bf16, the other bug the bound must reject); the last
    chunk's bank is returned as computed, in float32. tests/harness/test_sdm_gate.py plants it too."""

    def fn(
        k_idx: torch.Tensor,
        k_val: torch.Tensor,
        q_idx: torch.Tensor,
        q_val: torch.Tensor,
        v: torch.Tensor,
        g: torch.Tensor,
        beta: torch.Tensor,
        initial_bank: torch.Tensor | None = None,
        key_weighted_decay: bool = False,
        *,
        num_slots: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        seq, bank, ys = (k_idx, k_val, q_idx, q_val, v, g, beta), initial_bank, []
        for t0 in range(0, v.shape[1], 64):
            if t0:
                bank = bank.to(carry).float()
            part = (x[:, t0 : t0 + 64] for x in seq)
            y, bank = sdm_torch_chunk(*part, bank, key_weighted_decay, num_slots=num_slots)
            ys.append(y)
        return torch.cat(ys, dim=1), bank

    return fn


bank_carried_in_bf16 = chunk_by_chunk(torch.bfloat16)


def worst(fn: Callable[..., Any], shape: str, seeds: list[int]) -> dict[tuple[str, str], float]:
    """(regime, check) -> the worst value over `seeds` of the gate's comparison at `shape`, bf16, forward; and
    ("job", "final_state") -> the least over `seeds` of a job's worst final bank (over its regimes), which is what
    rejects a bug."""
    dims = dict(kv.split("=") for kv in shape.split(","))
    out: dict[tuple[str, str], float] = defaultdict(float)
    jobs = []
    for seed in seeds:
        case = Case("sdm", **{k: int(v) for k, v in dims.items()}, dtype="bf16", mode="fwd", seed=seed)
        report = verify_case(fn, case, seeds=1, extra_seed=False)
        job = 0.0
        for r in report.records:
            if r.check in CHECKS and r.reference == "oracle" and r.value is not None:
                key = (r.regime, r.check)
                out[key] = max(out[key], float(r.value))
                job = max(job, float(r.value)) if r.check == "final_state" else job
        jobs.append(job)
    out[("job", "final_state")] = min(jobs)
    return out


def main() -> None:
    """Print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0-4", help="first-last seed, inclusive")
    args = parser.parse_args()
    lo, hi = (int(s) for s in args.seeds.split("-"))
    seeds = list(range(lo, hi + 1))
    torch.set_num_threads(1)
    impls = {name: registry.get_impl("sdm", name) for name in ("torch_recurrent", "torch_chunk")}
    for shape in SHAPES:
        rows = {name: worst(fn, shape, seeds) for name, fn in impls.items()}
        with bf16_bank():
            rows["bf16 kept"] = worst(impls["torch_recurrent"], shape, seeds)
        rows["bf16 carried"] = worst(bank_carried_in_bf16, shape, seeds)
        print(f"{shape}, seeds {args.seeds}: worst over seeds, with and without an initial bank")
        for regime in sdm.SDM_REGIMES:
            cells = [f"{check} " + " ".join(f"{rows[n][(regime, check)]:.2e}" for n in rows) for check in CHECKS]
            print(f"  {regime:13s} " + " | ".join(cells) + f"   ({', '.join(rows)})")
        jobs = " ".join(f"{rows[n][('job', 'final_state')]:.2e}" for n in rows)
        print(f"  a job's worst final_state, least over seeds: {jobs}")


if __name__ == "__main__":
    main()
