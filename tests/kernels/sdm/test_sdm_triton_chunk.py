"""deltabench's Triton SDM forward (kernels/sdm/triton_chunk.py) under TRITON_INTERPRET=1, at tiny shapes (the
interpreter runs every program in Python): y and the final bank against the float64 oracle with a ragged last
chunk, T inside one chunk, colliding slots, key-weighted decay, repeated write slots and the dense limit (gdn);
bitwise the same across two calls and in a fresh process; bad input refused before any launch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from deltabench.kernels.sdm.triton_chunk import sdm_triton_chunk
from deltabench.references import gdn
from deltabench.references.sdm import make_inputs, sdm_recurrent

BOUND = 1e-5  # float32 against float64: these cases measure 1e-7 .. 5e-7 (relative Frobenius error)
CASES = [  # (B, T, H, S, D, W, R, C, regime, initial_bank)
    (1, 19, 2, 16, 4, 3, 2, 8, "collisions", True),  # ragged: chunks of 8, 8, 3
    (2, 5, 1, 12, 3, 2, 3, 8, "key_weighted", False),  # T inside one chunk
    (1, 16, 1, 20, 5, 4, 4, 8, "typical", True),  # T at a chunk multiple
]
IDS = [f"B{c[0]}-T{c[1]}-H{c[2]}-S{c[3]}-D{c[4]}-W{c[5]}-R{c[6]}-C{c[7]}-{c[8]}-h0{int(c[9])}" for c in CASES]


def _rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x.double() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("B,T,H,S,D,W,R,C,regime,h0", CASES, ids=IDS)
def test_forward_matches_oracle(
    B: int, T: int, H: int, S: int, D: int, W: int, R: int, C: int, regime: str, h0: bool
) -> None:
    x = make_inputs(B, T, H, S, D, W, R, seed=T, regime=regime, initial_bank=h0)
    ry, rbank = sdm_recurrent(**x)
    y, bank = sdm_triton_chunk(**x, chunk_size=C)
    assert y.shape == (B, T, H, D) and y.dtype == torch.float32 and bank.shape == (B, H, S, D)
    assert _rel(y, ry) < BOUND and _rel(bank, rbank) < BOUND, (_rel(y, ry), _rel(bank, rbank))


def test_bitwise_deterministic_and_repeats_decay_once() -> None:
    """Two calls give the same bits; a slot repeated within a token (allowed) decays once, as in the oracle; the
    initial bank is left as it was."""
    x = make_inputs(1, 11, 1, 10, 4, 3, 2, seed=2, regime="collisions", initial_bank=True)
    x["k_idx"][:, :, :, 2] = x["k_idx"][:, :, :, 0]
    bank0 = x["initial_bank"].clone()
    first = sdm_triton_chunk(**x, chunk_size=8, allow_repeated_writes=True)
    second = sdm_triton_chunk(**x, chunk_size=8, allow_repeated_writes=True)
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
    assert torch.equal(x["initial_bank"], bank0)
    ry, rbank = sdm_recurrent(**x, allow_repeated_writes=True)
    assert _rel(first[0], ry) < BOUND and _rel(first[1], rbank) < BOUND


def test_dense_limit_is_gdn() -> None:
    """S = W = R = d_k, every token writing and reading all slots with weights k and scale * q: gdn's oracle."""
    B, T, H, K, V = 1, 12, 1, 8, 4
    x = gdn.make_inputs(B, T, H, K, V, seed=4, initial_state=True)
    slots = torch.arange(K).expand(B, T, H, K)
    o, state = gdn.gdn_recurrent(**x)
    y, bank = sdm_triton_chunk(
        slots, x["k"], slots, x["q"] * K**-0.5, x["v"], x["g"], x["beta"], x["initial_state"], chunk_size=8
    )
    assert _rel(y, o) < BOUND and _rel(bank, state) < BOUND


_FRESH_PROCESS = """
import sys, torch
from deltabench.kernels.sdm.triton_chunk import sdm_triton_chunk
from deltabench.references.sdm import make_inputs
x = make_inputs(1, 13, 2, 12, 4, 3, 2, seed=6, regime="key_weighted", initial_bank=True)
torch.save(sdm_triton_chunk(**x, chunk_size=8), sys.argv[1])
"""


def test_bitwise_the_same_in_a_fresh_process(tmp_path: Path) -> None:
    """Another Python process computes the same bits as this one."""
    out = tmp_path / "fresh.pt"
    subprocess.run([sys.executable, "-c", _FRESH_PROCESS, str(out)], check=True, timeout=300)
    x = make_inputs(1, 13, 2, 12, 4, 3, 2, seed=6, regime="key_weighted", initial_bank=True)
    here = sdm_triton_chunk(**x, chunk_size=8)
    there = torch.load(out)
    assert all(torch.equal(a, b) for a, b in zip(here, there, strict=True))


@pytest.mark.parametrize(
    "edit,message",
    [
        (lambda x: x["k_idx"].__setitem__((0, 1, 0, 0), 99), "outside"),
        (lambda x: x["k_idx"].__setitem__((0, 1, 0, 1), int(x["k_idx"][0, 1, 0, 0])), "repeats write slot"),
        (lambda x: x.update(chunk_size=0), "chunk_size must be"),
    ],
    ids=["out-of-range", "repeated", "chunk-size"],
)
def test_bad_input_is_refused(edit, message: str) -> None:
    x = make_inputs(1, 4, 1, 8, 2, 2, 2, seed=1)
    x["chunk_size"] = 8
    edit(x)
    with pytest.raises(ValueError, match=message):
        sdm_triton_chunk(**x)
