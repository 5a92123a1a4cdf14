"""deltabench's Triton GDN decode step (in place) against the float64 oracle, under TRITON_INTERPRET=1."""

from __future__ import annotations

import pytest
import torch

from deltabench.correctness.engine import verify_case
from deltabench.harness import Case, get_impl, get_op
from deltabench.harness.ops import make_case_inputs
from deltabench.kernels.gdn.triton.decode import decode_launch, gdn_triton_decode, launch_decode
from deltabench.references.gdn import gdn_recurrent


@pytest.mark.parametrize(("T", "dtype"), [(1, "fp32"), (3, "bf16")])
def test_decode_updates_the_state_it_was_given(T: int, dtype: str) -> None:
    """The outputs and the new state match the oracle stepping from the same state, the new state written into
    the buffer given (the one returned)."""
    case = Case("gdn", B=2, T=T, H=3, K=32, V=48, dtype=dtype, mode="decode", regime="long")
    x = make_case_inputs(get_op("gdn"), case)
    args = [x[n] for n in ("q", "k", "v", "g", "beta")]
    ro, rht = gdn_recurrent(*args, initial_state=x["initial_state"])
    cache = x["initial_state"].clone()
    o, ht = gdn_triton_decode(*args, initial_state=cache)
    assert ht.data_ptr() == cache.data_ptr() and o.dtype == case.torch_dtype
    bound = 1e-5 if dtype == "fp32" else 1e-2
    assert ((o.double() - ro).norm() / ro.norm()).item() < bound
    assert ((cache.double() - rht).norm() / rht.norm()).item() < 1e-5


KERNELS = [
    {"kernel": "chunk"},
    {"kernel": "all"},
    {"kernel": "lazy"},
    {"kernel": "prefetch"},
    {"kernel": "persist", "fused": True, "per_sm": 2},
    {"kernel": "persist", "fused": False, "per_sm": 1},
]


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: "-".join(str(v) for v in k.values()))
@pytest.mark.parametrize(("T", "BV"), [(1, 16), (5, 16), (8, 32)])
def test_every_decode_launch_steps_like_the_oracle(kernel: dict, T: int, BV: int) -> None:
    """Each kernel a launch may pick (one chunk, every token loaded at once, token by token with the next
    prefetched, programs stepping several tiles), at one, an odd and the most tokens, with V (48) not a multiple of
    the block: outputs and the state in place. The persistent kernel runs 2 or 4 programs on the CPU, so each steps
    several of the 6-12 tiles, the last of them with no next tile."""
    case = Case("gdn", B=2, T=T, H=3, K=32, V=48, dtype="fp32", mode="decode", regime="long")
    x = make_case_inputs(get_op("gdn"), case)
    args = [x[n] for n in ("q", "k", "v", "g", "beta")]
    ro, rht = gdn_recurrent(*args, initial_state=x["initial_state"])
    cache, o = x["initial_state"].clone(), x["v"].new_empty(x["v"].shape)
    launch_decode(*args, cache, o, 32**-0.5, BV=BV, num_warps=1, **kernel)
    assert ((o.double() - ro).norm() / ro.norm()).item() < 1e-5
    assert ((cache.double() - rht).norm() / rht.norm()).item() < 1e-5


@pytest.mark.parametrize(("T", "log_decay"), [(8, -8.0), (5, -20.0), (3, -120.0)])
def test_the_lazy_decay_rescales_under_strong_decay(T: int, log_decay: float) -> None:
    """Even heads decaying by `log_decay` a token, past 2^-50 within the step (at -120 exp(g) is under float32's
    smallest normal, at three tokens its product 0): the lazy kernel rescales its slice and matches the oracle to
    fp32 accuracy (fp32 inputs), outputs and state."""
    case = Case("gdn", B=2, T=T, H=4, K=32, V=48, dtype="fp32", mode="decode", regime="long")
    x = make_case_inputs(get_op("gdn"), case)
    x["g"][:, :, ::2] = log_decay
    args = [x[n] for n in ("q", "k", "v", "g", "beta")]
    ro, rht = gdn_recurrent(*args, initial_state=x["initial_state"])
    cache, o = x["initial_state"].clone(), x["v"].new_empty(x["v"].shape)
    launch_decode(*args, cache, o, 32**-0.5, BV=16, num_warps=1, kernel="lazy")
    assert torch.isfinite(o).all() and torch.isfinite(cache).all()
    assert ((o.double() - ro).norm() / ro.norm()).item() < 1e-5
    assert ((cache.double() - rht).norm() / rht.norm()).item() < 1e-5


def test_the_launch_rule_covers_the_served_shapes() -> None:
    """decode_launch's choices at the decode-h200 shapes are launches launch_decode takes, and its V block never
    exceeds V's power of two."""
    kinds = set()
    for B in (1, 8, 64, 256, 512):
        for T in (1, 2, 4, 8):
            launch = decode_launch(B, 16, 128, T)
            assert launch["kernel"] in ("all", "prefetch") and launch["num_warps"] in (1, 2, 4)
            kinds.add(launch["kernel"])
    assert kinds == {"all", "prefetch"}
    assert decode_launch(512, 16, 16, 1)["BV"] == 16
    with pytest.raises(ValueError, match="kernel is"):
        x = make_case_inputs(get_op("gdn"), Case("gdn", B=1, T=1, H=1, K=16, V=16, mode="decode"))
        args = [x[n] for n in ("q", "k", "v", "g", "beta")]
        launch_decode(*args, x["initial_state"], x["v"].clone(), 0.25, BV=16, num_warps=1, kernel="fused")


def test_decode_refuses_a_state_it_cannot_update() -> None:
    x = make_case_inputs(get_op("gdn"), Case("gdn", B=1, T=1, H=1, K=16, V=16, mode="decode"))
    args = [x[n] for n in ("q", "k", "v", "g", "beta")]
    with pytest.raises(ValueError, match="needs the state"):
        gdn_triton_decode(*args)
    with pytest.raises(ValueError, match="contiguous float32"):
        gdn_triton_decode(*args, initial_state=x["initial_state"].double())


def test_triton_decode_passes_the_gate() -> None:
    case = Case("gdn", B=2, T=2, H=2, K=16, V=32, mode="decode")
    report = verify_case(get_impl("gdn", "triton_decode"), case, seeds=1, extra_seed=False, regimes=("long",))
    assert report.passed, [(r.check, r.detail) for r in report.failures]
