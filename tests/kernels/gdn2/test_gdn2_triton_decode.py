"""deltabench's Triton GDN-2 and KDA decode steps (the shared decode kernel, in place) against the float64 oracle,
under TRITON_INTERPRET=1."""

from __future__ import annotations

import pytest
import torch

from deltabench.correctness.engine import verify_case
from deltabench.harness import Case, get_impl, get_op
from deltabench.harness.ops import make_case_inputs
from deltabench.kernels.common.triton.decode import launch_delta_decode
from deltabench.references.gdn2 import gdn2_recurrent
from deltabench.references.kda import kda_recurrent

ARGS = {"gdn2": ("q", "k", "v", "g", "b", "w"), "kda": ("q", "k", "v", "g", "beta")}
ORACLES = {"gdn2": gdn2_recurrent, "kda": kda_recurrent}


FORMS = [{"fused": True}, {"fused": False}, {"lazy": True}]


@pytest.mark.parametrize("op", ["gdn2", "kda"])
@pytest.mark.parametrize("form", FORMS, ids=["fused", "plain", "lazy"])
@pytest.mark.parametrize(("T", "per_sm"), [(1, 1), (5, 2), (8, 64), (8, 0), (1, 0)])
def test_every_launch_steps_like_the_oracle(op: str, form: dict, T: int, per_sm: int) -> None:
    """Each token form, at one, an odd and the most tokens, with 2, 4 or 9 persistent programs over 9 tiles (V = 48
    not a multiple of the 16-column block, 3 heads; 9: one a tile) or one program a tile (`per_sm` 0): outputs, and
    the state in the buffer given."""
    case = Case(op, B=1, T=T, H=3, K=32, V=48, dtype="fp32", mode="decode", regime="long")
    x = make_case_inputs(get_op(op), case)
    args = [x[n] for n in ARGS[op]]
    ro, rht = ORACLES[op](*args, initial_state=x["initial_state"])
    cache, o = x["initial_state"].clone(), x["v"].new_empty(x["v"].shape)
    b, w = (x["b"], x["w"]) if op == "gdn2" else (x["beta"], x["beta"])
    launch_delta_decode(*args[:4], b, w, cache, o, 32**-0.5, BV=16, num_warps=1, per_sm=per_sm, **form)
    assert ((o.double() - ro).norm() / ro.norm()).item() < 1e-5
    assert ((cache.double() - rht).norm() / rht.norm()).item() < 1e-5


@pytest.mark.parametrize("op", ["gdn2", "kda"])
@pytest.mark.parametrize(("T", "log_decay"), [(8, -8.0), (5, -20.0), (3, -120.0)])
def test_the_lazy_form_rescales_rows_under_strong_decay(op: str, T: int, log_decay: float) -> None:
    """Every other key channel of every head decaying by `log_decay` a token, past 2^-50 within the step (at -120
    exp(g) is under float32's smallest normal, at three tokens its product 0), the rest as drawn: the lazy form
    rescales those rows and matches the oracle to fp32 accuracy, outputs and state."""
    case = Case(op, B=1, T=T, H=3, K=32, V=48, dtype="fp32", mode="decode", regime="long")
    x = make_case_inputs(get_op(op), case)
    x["g"][..., ::2] = log_decay
    args = [x[n] for n in ARGS[op]]
    ro, rht = ORACLES[op](*args, initial_state=x["initial_state"])
    cache, o = x["initial_state"].clone(), x["v"].new_empty(x["v"].shape)
    b, w = (x["b"], x["w"]) if op == "gdn2" else (x["beta"], x["beta"])
    launch_delta_decode(*args[:4], b, w, cache, o, 32**-0.5, BV=16, num_warps=1, lazy=True)
    assert torch.isfinite(o).all() and torch.isfinite(cache).all()
    assert ((o.double() - ro).norm() / ro.norm()).item() < 1e-5
    assert ((cache.double() - rht).norm() / rht.norm()).item() < 1e-5


@pytest.mark.parametrize("op", ["gdn2", "kda"])
def test_triton_decode_passes_the_gate(op: str) -> None:
    """The registered impl through the gate (bf16 inputs, the strong-decay regime, two tokens)."""
    case = Case(op, B=2, T=2, H=2, K=16, V=32, mode="decode")
    report = verify_case(get_impl(op, "triton_decode"), case, seeds=1, extra_seed=False, regimes=("strong",))
    assert report.passed, [(r.check, r.detail) for r in report.failures]
