"""Proof that the gate bites: bugs planted in correct impls are rejected at fp32 and at bf16, on the check that
names them, while the correct impls pass at every seed and regime (the other side of the proof).

Each bug is a small variant of a plain float32 token loop (written here, so that the bug sits inside the
recurrence) or a wrapper of the op's registered ``torch_chunk``; each is registered under a test name and
verified through the public API, as a user's kernel would be.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from grad_scale import ScaleGrad

from deltabench.correctness.engine import verify_case
from deltabench.harness import Case, get_impl, get_op, register_impl
from deltabench.harness import registry as _registry

OPS = ("gdn", "gdn2", "kda")
# T = 100 is not a multiple of 64: a chunked impl has a partial last chunk; K != V catches transposed states.
SHAPE = {"B": 1, "T": 100, "H": 2, "K": 16, "V": 24}
CHUNK = 64


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _as_general(op: str, gates: tuple[torch.Tensor, ...], K: int, V: int) -> tuple[torch.Tensor, ...]:
    """Every op as GDN-2: per-channel log-decay g [B,T,H,K], erase strength b [..,K], write strength w [..,V]."""
    if op == "gdn2":
        return gates
    g, beta = gates
    if op == "gdn":
        g = g[..., None].expand(*g.shape, K)
    return g, beta[..., None].expand(*beta.shape, K), beta[..., None].expand(*beta.shape, V)


def delta_loop(op: str, bug: str | None = None) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """A float32 token loop of `op` (state float32, o in v's dtype), with `bug` planted in the recurrence."""

    def fn(q, k, v, *gates, scale=None, initial_state=None):
        B, T, H, K = q.shape
        V = v.shape[-1]
        scale = K**-0.5 if scale is None else scale
        out_dtype = v.dtype
        g, b, w = (x.float() for x in _as_general(op, gates, K, V))
        q, k, v = q.float(), k.float(), v.float()
        S = q.new_zeros(B, H, K, V)
        if initial_state is not None and bug != "initial_state_ignored":
            S = initial_state.float()
        outs = []
        before_last = S
        for t in range(T):
            g_t = g[:, t]
            if bug == "gate_previous_token":
                g_t = g[:, t - 1] if t > 0 else torch.zeros_like(g_t)
            before_last = S
            if bug != "decay_after_update":
                S = S * g_t.exp()[..., None]
            r = torch.einsum("bhk,bhkv->bhv", b[:, t] * k[:, t], S)
            S = S + k[:, t, ..., None] * (w[:, t] * v[:, t] - r)[..., None, :]
            if bug == "decay_after_update":
                S = S * g_t.exp()[..., None]
            outs.append(torch.einsum("bhk,bhkv->bhv", q[:, t] * scale, S))
        o = torch.stack(outs, dim=1).to(out_dtype)
        return o, (before_last if bug == "final_state_missing_last_token" else S)

    return fn


def chunk_wrapper(op: str, bug: str) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """The op's correct ``torch_chunk`` with `bug` planted around it."""
    correct = get_impl(op, "torch_chunk")

    def fn(q, k, v, *gates, scale=None, initial_state=None):
        if bug == "grad_k_scaled":  # a wrong constant in one backward kernel: dk off by 1%
            return correct(q, ScaleGrad.apply(k, 1.01), v, *gates, scale=scale, initial_state=initial_state)
        if bug == "output_through_bf16":
            o, s = correct(q, k, v, *gates, scale=scale, initial_state=initial_state)
            return o.to(torch.bfloat16).to(o.dtype), s
        if bug == "partial_chunk_dropped":  # a grid of T // C chunks instead of ceil(T / C)
            T = q.shape[1]
            full = T // CHUNK * CHUNK
            head = [x[:, :full] for x in (q, k, v, *gates)]
            o, s = correct(*head, scale=scale, initial_state=initial_state)
            tail = v.new_zeros(v.shape[0], T - full, *v.shape[2:])
            return torch.cat([o, tail], dim=1), s
        raise ValueError(bug)

    return fn


# bug -> (builder, the checks that must fail, the checks allowed to fail, where it applies)
LOOP_BUGS = ("decay_after_update", "gate_previous_token", "initial_state_ignored", "final_state_missing_last_token")
CHUNK_BUGS = ("partial_chunk_dropped", "grad_k_scaled", "output_through_bf16")
MUST_FAIL = {
    "decay_after_update": {"output", "final_state"},
    "gate_previous_token": {"output", "final_state"},
    # At T=100 a typical decay (about 0.5 per token) has forgotten h0 by the last token: the state may look right.
    "initial_state_ignored": {"output", "grad:initial_state"},
    "final_state_missing_last_token": {"final_state", "streaming:output"},
    "partial_chunk_dropped": {"output", "final_state"},
    "grad_k_scaled": {"grad:k"},
    "output_through_bf16": {"output"},
}


@pytest.fixture
def planted() -> Iterator[Callable[[str, str, Callable[..., Any]], Any]]:
    """Register impls under test names for the test's duration, then remove them from the registry."""
    names: list[tuple[str, str]] = []

    def plant(op: str, name: str, fn: Callable[..., Any]) -> Any:
        register_impl(op, name, backend="torch", devices=("cpu",), dtypes=("fp32", "bf16", "fp16"))(fn)
        names.append((op, name))
        return get_impl(op, name)

    yield plant
    for key in names:
        _registry._REGISTRY.pop(key, None)


def _failed_checks(report: Any) -> set[str]:
    return {r.check for r in report.failures}


# Every bug at fp32 and bf16, but for rounding an output through bf16: on a bf16 output that is no bug at all.
BUG_DTYPES = [
    (bug, dtype)
    for bug in LOOP_BUGS + CHUNK_BUGS
    for dtype in ("fp32", "bf16")
    if not (bug == "output_through_bf16" and dtype == "bf16")
]


@pytest.mark.parametrize(("bug", "dtype"), BUG_DTYPES)
@pytest.mark.parametrize("op", OPS)
def test_planted_bug_is_rejected(op: str, bug: str, dtype: str, planted: Any) -> None:
    """Each planted bug fails the gate, on the check that names it."""
    fn = delta_loop(op, bug) if bug in LOOP_BUGS else chunk_wrapper(op, bug)
    impl = planted(op, f"test_planted_{bug}", fn)
    case = Case(op, **SHAPE, dtype=dtype, mode="fwd+bwd")
    report = verify_case(impl, case, seeds=1, extra_seed=False)
    assert not report.passed
    failed = _failed_checks(report)
    assert MUST_FAIL[bug] <= failed, f"{bug} at {dtype}: failed {sorted(failed)}"
    if bug == "grad_k_scaled":  # the forward is right: only dk (and nothing else) may be flagged
        assert failed == {"grad:k"}
        worst = max(r.value for r in report.failures)
        assert worst < 0.02  # it is caught by a margin, not by a blunder elsewhere
    if bug == "initial_state_ignored":  # right from a zero state; wrong from h0 and when resuming a stream
        assert all(r.initial_state or r.check.startswith("streaming") for r in report.failures)
        assert any(r.check.startswith("streaming") for r in report.failures)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("op", OPS)
def test_unplanted_loop_passes(op: str, dtype: str, planted: Any) -> None:
    """The loop the bugs are planted in passes as written (so each failure above is the bug's doing)."""
    impl = planted(op, "test_correct_loop", delta_loop(op))
    report = verify_case(impl, Case(op, **SHAPE, dtype=dtype, mode="fwd+bwd"), seeds=1, extra_seed=False)
    assert report.passed, [(r.check, r.value, r.threshold) for r in report.failures]


@pytest.mark.parametrize("regime", ["typical", "long", "strong"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("impl_name", ["torch_recurrent", "torch_chunk"])
@pytest.mark.parametrize("op", OPS)
def test_correct_impls_pass_every_seed_and_regime(op: str, impl_name: str, dtype: str, regime: str) -> None:
    """The built-in torch impls pass at a fixed seed plus a drawn one, in both regimes, with and without h0."""
    impl = get_impl(op, impl_name)
    case = Case(op, B=1, T=70, H=2, K=16, V=24, dtype=dtype, regime=regime, mode="fwd+bwd", seed=11)
    report = verify_case(impl, case, seeds=1, extra_seed=True, regimes=regime)
    assert report.passed, (report.drawn_seed, [(r.check, r.seed, r.value, r.threshold) for r in report.failures])
    assert len(report.seeds) == 2 and report.seeds[0] == 11
    checked = {(r.check, r.initial_state) for r in report.records if r.metric == "rel_fro"}
    names = {f"grad:{n}" for n in get_op(op).args} | {"output", "final_state"}
    assert {(c, h0) for c in names for h0 in (False, True)} <= checked
    assert {("streaming:output", True), ("boundary:output", True)} <= checked
    assert ("grad:initial_state", True) in checked
