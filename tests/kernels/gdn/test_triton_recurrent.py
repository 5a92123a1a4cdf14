"""deltabench's Triton fused recurrent GDN (forward only) against the float64 oracle, under TRITON_INTERPRET=1."""

from __future__ import annotations

import pytest
import torch

from deltabench.kernels.gdn.triton.fused_recurrent import fused_recurrent_gated_delta_rule, gdn_triton_recurrent
from deltabench.references.gdn import gdn_recurrent, make_inputs


@pytest.mark.parametrize(
    "T,dtype,regime,h0",
    [(1, torch.float32, "typical", True), (65, torch.float32, "long", False), (63, torch.bfloat16, "long", True)],
    ids=["T1-fp32-typical-h01", "T65-fp32-long-h00", "T63-bf16-long-h01"],
)
def test_recurrent_matches_oracle(T: int, dtype: torch.dtype, regime: str, h0: bool) -> None:
    x = make_inputs(2, T, 3, 32, 48, dtype=dtype, seed=T, regime=regime, initial_state=h0)
    args = [x[n] for n in ("q", "k", "v", "g", "beta")]
    o, ht = gdn_triton_recurrent(*args, initial_state=x.get("initial_state"))
    ro, rht = gdn_recurrent(*args, initial_state=x.get("initial_state"))
    bound = 1e-5 if dtype == torch.float32 else 1e-2  # fp32 state throughout; bf16 only in o's storage
    assert o.dtype == dtype and ht.dtype == torch.float32
    assert ((o.double() - ro).norm() / ro.norm()).item() < bound
    assert ((ht.double() - rht).norm() / rht.norm()).item() < 1e-5


def test_decode_steps_chain_to_the_full_sequence() -> None:
    """Feeding the state back one token at a time gives the same outputs as one call."""
    x = make_inputs(1, 5, 2, 16, 16, seed=1)
    args = [x[n] for n in ("q", "k", "v", "g", "beta")]
    o_full, h_full = fused_recurrent_gated_delta_rule(*args)
    h = None
    for t in range(5):
        o_t, h = fused_recurrent_gated_delta_rule(*(a[:, t : t + 1] for a in args), initial_state=h)
        torch.testing.assert_close(o_t, o_full[:, t : t + 1], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(h, h_full, rtol=1e-5, atol=1e-6)
