"""Phase 1 of deltabench's Triton SDM (kernels/sdm/triton/) under TRITON_INTERPRET=1, at tiny shapes: the decay
backward's block skip and the replay's Z-only Gram kernel give the bits of the kernels that do all the work, over
seeds, shapes and regimes (the strong one and key-weighted decay among them)."""

from __future__ import annotations

import pytest
import torch
from test_sdm_torch import run_with_grads

from deltabench.kernels.sdm.triton import triton_chunk as fwd_module
from deltabench.kernels.sdm.triton import triton_chunk_bwd as bwd_module
from deltabench.kernels.sdm.triton.triton_chunk import sdm_triton_chunk
from deltabench.references.sdm import make_inputs

# (B, T, H, S, D, W, R, C, regime, seed): sparse slots (most blocks skipped), collisions, key-weighted, strong
BIT_CASES = [
    (1, 19, 2, 64, 3, 3, 2, 16, "typical", 0),
    (1, 21, 1, 10, 3, 4, 3, 8, "collisions", 1),
    (2, 13, 1, 40, 2, 3, 3, 16, "key_weighted", 2),
    (1, 60, 1, 8, 2, 4, 2, 64, "strong", 3),  # one chunk of 64, 4 padding tokens
]
BIT_IDS = [f"T{c[1]}-H{c[2]}-S{c[3]}-W{c[5]}-R{c[6]}-C{c[7]}-{c[8]}" for c in BIT_CASES]


def _same_bits(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> list[str]:
    """The names whose tensors differ in any bit (-0 against +0 included)."""
    return [n for n in a if not torch.equal(a[n].view(torch.int32), b[n].view(torch.int32))]


class _NoSkip:
    """decay_bwd_kernel launched with SKIP=False: every block summed, as before the skip."""

    def __init__(self, kernel) -> None:
        self.kernel = kernel

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.kernel[grid](*args, SKIP=False, **kwargs)


@pytest.mark.parametrize("B,T,H,S,D,W,R,C,regime,seed", BIT_CASES, ids=BIT_IDS)
def test_decay_bwd_block_skip_keeps_the_bits(
    B: int, T: int, H: int, S: int, D: int, W: int, R: int, C: int, regime: str, seed: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """Every gradient of a call with decay_bwd's block skip equals, bit for bit, that of one summing every block."""
    x = make_inputs(B, T, H, S, D, W, R, seed=seed, regime=regime, initial_bank=True)
    skipped = run_with_grads(sdm_triton_chunk, x, torch.float32, chunk_size=C)
    monkeypatch.setattr(bwd_module, "decay_bwd_kernel", _NoSkip(bwd_module.decay_bwd_kernel))
    summed = run_with_grads(sdm_triton_chunk, x, torch.float32, chunk_size=C)
    assert skipped.keys() == summed.keys() and not _same_bits(skipped, summed)


def test_decay_bwd_block_skip_keeps_signed_zeros() -> None:
    """A row whose every sum is zero keeps the sign SKIP=False gives it: -0 in the slot total becomes +0 at the
    first block summed, skipped or not (slots far apart: every block but the row's own is skipped)."""
    E, P, W, R = 96, 64, 3, 2
    gen = torch.Generator().manual_seed(4)
    s_w = torch.randperm(1000, generator=gen)[:E].view(1, E)
    s_r = torch.randperm(1000, generator=gen)[:P].view(1, P) + 1000  # reads meet no write
    dL_w = torch.zeros(1, E)
    dL_r = torch.randn(1, P, generator=gen)
    dtot = torch.randn(1, E, generator=gen)
    dtot[0, ::3] = -0.0
    outs = []
    for skip in (True, False):
        dld = torch.empty(1, E)
        bwd_module.decay_bwd_kernel[(1, E // 32)](s_w, s_r, dL_w, dL_r, dtot, dld, E, P, W, R, 32, 32, SKIP=skip)
        outs.append(dld)
    assert torch.equal(outs[0].view(torch.int32), outs[1].view(torch.int32))
    assert not torch.equal(outs[0].view(torch.int32), dtot.view(torch.int32))  # the -0s did become +0


@pytest.mark.parametrize("B,T,H,S,D,W,R,C,regime,seed", BIT_CASES, ids=BIT_IDS)
def test_replay_z_only_gram_gives_the_forward_z(
    B: int, T: int, H: int, S: int, D: int, W: int, R: int, C: int, regime: str, seed: int
) -> None:
    """The Gram kernel without A and QK (the backward's replay) writes the bits of the forward's Z, for all chunks
    and for a segment of them, and leaves A and QK untouched."""
    x = make_inputs(B, T, H, S, D, W, R, seed=seed, regime=regime, initial_bank=True)
    S_ = x.pop("num_slots")
    kw = x.pop("key_weighted_decay")
    args = [x[n] for n in ("k_idx", "k_val", "q_idx", "q_val", "v", "g", "beta", "initial_bank")]
    _, _, sv = fwd_module._forward(*args, kw, S_, C, save=True)
    assert sv is not None and sv.Z is not None and sv.segment == sv.s_w.shape[1]
    BH, N, E = sv.s_w.shape
    for c0, n in ((0, N), (N - 1, 1)):
        Z = torch.full((BH, n, E, C), float("nan"))
        untouched = torch.full((BH, n, C, C), 7.0)
        fwd_module._gram(sv.s_w, sv.kv, sv.L_w, sv.L_tot, sv.s_r, sv.qv, sv.L_r, untouched, untouched, Z, c0, aqk=False)
        assert torch.equal(Z.view(torch.int32), sv.Z[:, c0 : c0 + n].contiguous().view(torch.int32))
        assert bool((untouched == 7.0).all())
