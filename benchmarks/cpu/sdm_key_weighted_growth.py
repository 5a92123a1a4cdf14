"""How large sdm's bank grows under the key-weighted decay with signed write weights against non-negative ones: why
the contract keeps that decay to ``k_val >= 0`` (references/sdm.py, check_sdm_inputs).

Draws the key_weighted regime at T = 8192 tokens and runs torch_recurrent's token loop (its step, float32 bank: the
impl itself refuses signed weights) with the regime's weights (>= 0) and with the typical regime's signed weights of
the same seed (L2-normalised, as SDM 2.0.0's ``l2_normalize`` write activation gives), printing the largest |bank|
and |y| of each.

    PYTHONPATH=src python benchmarks/cpu/sdm_key_weighted_growth.py
"""

from __future__ import annotations

import torch

from deltabench.kernels.sdm.torch.decode import sdm_step
from deltabench.references import sdm

# (S, W = R, D): sdm-smoke's bank, the gate tests' collision-heavy one, the dense limit's
SHAPES = ((256, 8, 32), (32, 4, 8), (128, 128, 128))


def token_loop(x: dict, k_val: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """torch_recurrent's loop without its argument check: ``(y, bank)`` under the key-weighted decay."""
    B, T, H = x["k_idx"].shape[:3]
    bank = torch.zeros(B, H, x["num_slots"], x["v"].shape[-1])
    first = sdm.first_write_mask(x["k_idx"])
    ys = []
    for t in range(T):
        args = (x["k_idx"][:, t], k_val[:, t], x["q_idx"][:, t], x["q_val"][:, t], x["v"][:, t], x["g"][:, t])
        y, bank = sdm_step(bank, *args, x["beta"][:, t], True, first[:, t])
        ys.append(y)
    return torch.stack(ys, dim=1), bank


def main() -> None:
    """Print one line per shape."""
    torch.set_num_threads(2)
    T = 8192
    for S, W, D in SHAPES:
        x = sdm.make_inputs(1, T, 2, S, D, W, W, seed=0, regime="key_weighted")
        signed = sdm.make_inputs(1, T, 2, S, D, W, W, seed=0)["k_val"]
        cells = []
        for label, k_val in (("k_val >= 0", x["k_val"]), ("signed", signed)):
            y, bank = token_loop(x, k_val)
            cells.append(f"{label}: |bank| {bank.abs().max():.2g}, |y| {y.abs().max():.2g}")
        print(f"S{S}-W{W}-D{D}, T {T}: " + "; ".join(cells))


if __name__ == "__main__":
    main()
