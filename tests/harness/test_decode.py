"""Mode ``decode``: T = 1..8 new tokens from a state drawn as a prefix leaves it, gated against the float64 oracle.

The decode impls pass (gdn, gdn2, kda, at fp32 and bf16), planted decode bugs in an in-place token loop fail on the
check that names them (state not written back, decay applied after the update, tokens taken in the wrong order, the
state ignored), and the mode's rules hold: T at most 8, no backward, an impl runs only the modes it declares.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from deltabench.correctness.engine import verify_case
from deltabench.harness import Case, get_impl, get_op, register_impl
from deltabench.harness import registry as _registry
from deltabench.harness.cases import has_backward
from deltabench.harness.errors import BadInput
from deltabench.harness.ops import decode_state, make_case_inputs, work

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SHAPE = {"B": 2, "T": 2, "H": 2, "K": 16, "V": 24}  # K != V catches a transposed state
FAST = {"seeds": 1, "extra_seed": False}


def gdn_decode_loop(bug: str | None = None) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """A float32 GDN decode step writing its new state into the buffer it is given, with `bug` planted."""

    def fn(q, k, v, g, beta, scale=None, initial_state=None):
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        S = torch.zeros_like(initial_state) if bug == "state_ignored" else initial_state.clone()
        T = q.shape[1]
        order = range(T - 1, -1, -1) if bug == "tokens_reversed" else range(T)
        outs: dict[int, torch.Tensor] = {}
        for t in order:
            k_t, v_t = k[:, t].float(), v[:, t].float()
            decay = g[:, t].float().exp()[..., None, None]
            if bug != "decay_after_update":
                S = S * decay
            u = beta[:, t].float()[..., None] * (v_t - torch.einsum("bhk,bhkv->bhv", k_t, S))
            S = S + k_t[..., :, None] * u[..., None, :]
            if bug == "decay_after_update":
                S = S * decay
            outs[t] = torch.einsum("bhk,bhkv->bhv", q[:, t].float() * scale, S).to(v.dtype)
        if bug != "state_not_written_back":
            initial_state.copy_(S)
        return torch.stack([outs[t] for t in range(T)], dim=1), S

    return fn


@pytest.fixture
def planted() -> Iterator[Callable[[str, Callable[..., Any]], Any]]:
    """Register gdn decode impls (in place) under test names for the test's duration."""
    names: list[str] = []

    def plant(name: str, fn: Callable[..., Any]) -> Any:
        register_impl(
            "gdn", name, backend="torch", devices=("cpu",), dtypes=("fp32", "bf16"), supports_backward=False,
            modes=("decode",), state_in_place=True,
        )(fn)  # fmt: skip
        names.append(name)
        return get_impl("gdn", name)

    yield plant
    for name in names:
        _registry._REGISTRY.pop(("gdn", name), None)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("op", ["gdn", "gdn2", "kda"])
def test_torch_decode_passes(op: str, dtype: str) -> None:
    """Each op's torch_decode passes the decode gate in every regime (the length sweep: T = 1, 3 and 8)."""
    report = verify_case(get_impl(op, "torch_decode"), Case(op, **SHAPE, dtype=dtype, mode="decode"), **FAST)
    assert report.passed, [(r.check, r.detail) for r in report.failures]
    assert "lengths T=1, T=3, T=8" in report.reference
    assert not any(r.check.startswith("grad") for r in report.records)  # no backward in a decode step


def test_unplanted_loop_passes(planted: Any) -> None:
    """The test's own in-place loop, without a bug, passes: the failures below are the bugs'."""
    impl = planted("test_decode_correct", gdn_decode_loop())
    assert verify_case(impl, Case("gdn", **SHAPE, mode="decode"), **FAST).passed


@pytest.mark.parametrize(
    ("bug", "fails"),
    [
        ("state_not_written_back", {"final_state"}),
        ("decay_after_update", {"output", "final_state"}),
        ("tokens_reversed", {"output", "final_state"}),
        ("state_ignored", {"output", "final_state"}),
    ],
)
def test_planted_decode_bug_fails(bug: str, fails: set[str], planted: Any) -> None:
    """Each planted decode bug fails the gate on the checks that name it."""
    impl = planted(f"test_decode_{bug}", gdn_decode_loop(bug))
    report = verify_case(impl, Case("gdn", **SHAPE, mode="decode"), **FAST)
    assert not report.passed
    assert fails <= {r.check for r in report.failures}, {r.check for r in report.failures}


def test_sdm_torch_decode_passes() -> None:
    """sdm's torch_decode (its bank updated in place) passes the decode gate in every sdm regime."""
    case = Case("sdm", B=1, T=2, H=2, S=32, D=8, W=3, R=2, mode="decode")
    report = verify_case(get_impl("sdm", "torch_decode"), case, **FAST)
    assert report.passed, [(r.check, r.detail) for r in report.failures]
    w = work("sdm", case.dims, "fp32", "decode")
    assert w["state_bytes"] == 1 * 2 * 2 * 8 * 4 * (2 * 3 + 2)  # the slots touched: W read and written, R read


def test_decode_state_is_a_prefix_state() -> None:
    """The state a decode case steps from is the oracle's after the seeded prefix: not zero, not the random start,
    the same for the same seed, another for another seed; a fwd case's state is still the plain draw."""
    spec = get_op("gdn")
    case = Case("gdn", **SHAPE, mode="decode")
    inputs = make_case_inputs(spec, case)
    state = inputs["initial_state"]
    assert state.dtype == torch.float32 and list(state.shape) == [2, 2, 16, 24]
    assert state.abs().max() > 0.1
    assert torch.equal(state, decode_state(spec, case))
    assert not torch.equal(state, decode_state(spec, case.replace(seed=1)))
    plain = make_case_inputs(spec, case.replace(mode="fwd", initial_state=True))["initial_state"]
    assert not torch.allclose(state, plain)
    assert "initial_state" not in make_case_inputs(spec, case.replace(mode="fwd"))


@pytest.fixture
def no_decode_op() -> Iterator[None]:
    """gdn's contract registered as op ``no_decode_op`` without a decode mode, for the test's duration."""
    import dataclasses

    from deltabench.harness.ops import OPS, register_op

    register_op(dataclasses.replace(get_op("gdn"), name="no_decode_op", decode=False))
    yield
    OPS.pop("no_decode_op", None)


@pytest.mark.usefixtures("no_decode_op")
def test_decode_rules() -> None:
    """T is 1..8 in decode; an op without a decode mode refuses it; decode does not back-propagate; impls run only
    their declared modes (a decode impl decodes only, a full-sequence impl may decode too)."""
    with pytest.raises(BadInput, match="T from 1 to 8"):
        Case("gdn", B=1, T=9, H=1, K=8, V=8, mode="decode")
    with pytest.raises(BadInput, match="no decode mode"):
        Case("no_decode_op", B=1, T=1, H=1, K=8, V=8, mode="decode")
    assert not has_backward("decode") and has_backward("fwd+bwd") and not has_backward("fwd")
    case = Case("gdn", **SHAPE, mode="decode")
    assert get_impl("gdn", "torch_decode").check_case(case.replace(mode="fwd")) == "runs mode decode, not fwd"
    assert get_impl("gdn", "torch_decode").check_case(case) is None
    assert get_impl("gdn", "torch_recurrent").check_case(case) is None


def test_decode_work_model() -> None:
    """A decode step's bytes are its state read and written (float32) plus its tokens' inputs and outputs."""
    dims = {"B": 8, "T": 2, "H": 16, "K": 128, "V": 128}
    w = work("gdn", dims, "bf16", "decode")
    state = 8 * 16 * 128 * 128 * 4
    assert w["state_bytes"] == 2 * state
    tokens = 8 * 2 * 16 * (2 * 128 + 128 + 128) * 2 + 8 * 2 * 16 * (4 + 2)  # q, k, v, o in bf16; g fp32, beta bf16
    assert w["bytes"] == 2 * state + tokens
    assert w["flops"] == 8 * 2 * 16 * 7 * 128 * 128


def test_decode_figures() -> None:
    """A decode result's figures: us per step, new tokens per second, state GB/s and its share of the copy ceiling."""
    from deltabench.runners.ceilings import work_figures

    dims = {"B": 8, "T": 2, "H": 16, "K": 128, "V": 128}
    fig = work_figures("gdn", dims, "bf16", "decode", 0.004, {"copy_gbps": 4000.0, "matmul_tflops": 500.0})
    state = 2 * 8 * 16 * 128 * 128 * 4
    assert fig.us_per_step == pytest.approx(4.0)
    assert fig.tokens_per_s == pytest.approx(16 / 4e-6)
    assert fig.state_gbps == pytest.approx(state / 4e-6 / 1e9)
    assert fig.pct_of_copy == pytest.approx(100 * state / 4e-6 / 1e9 / 4000.0)
    assert work_figures("gdn", dims, "bf16", "fwd", 0.004, {}).us_per_step is None


def test_decode_gate_shapes() -> None:
    """The shapes a decode gate calls an impl at (for the impls that compile each shape) are decode cases: the full
    shape, its streaming halves and the sweep's T = 1, 3 and 8 with theirs."""
    from deltabench.correctness.plan import gate_shapes

    shapes = gate_shapes(get_impl("gdn", "torch_decode"), Case("gdn", **SHAPE, mode="decode"))
    assert {c.mode for c in shapes} == {"decode"}
    assert {(c.B, c.T) for c in shapes} == {(2, 2), (2, 1), (1, 1), (1, 3), (1, 2), (1, 8), (1, 4)}


def test_decode_timer_rotation_and_refusals() -> None:
    """The decode timer (CUDA only, tried on a GPU by benchmarks/gpu/decode_timer.py) imports here; its rotation
    overflows L2 twice per pass (at least 2 copies, at most 512), and it refuses a case it cannot time."""
    from deltabench.runners.decode_timer import MIN_CALLS_PER_REPLAY, calls_per_replay, rotation_copies, time_decode

    l2 = 60 * 2**20  # an H200's
    state = 16 * 128 * 128 * 4  # B = 1, H = 16, K = V = 128, float32: 1 MiB
    assert rotation_copies(2 * state, l2) == 60
    assert rotation_copies(512 * 2 * state, l2) == 2
    assert rotation_copies(100, l2) == 512
    with pytest.raises(ValueError, match="positive"):
        rotation_copies(0, l2)
    with pytest.raises(ValueError, match="decode case on cuda"):
        time_decode(get_impl("gdn", "torch_decode"), Case("gdn", **SHAPE, mode="decode"))
    # a run's replay calls every copy once, and at least MIN_CALLS_PER_REPLAY times (its launch then amortised)
    assert [calls_per_replay(c) for c in (1, 2, 60, 512)] == [MIN_CALLS_PER_REPLAY] * 2 + [60, 512]
    with pytest.raises(ValueError, match="at least one copy"):
        calls_per_replay(0)
