"""Proof that the gate feeds impls what they would otherwise get wrong unseen: a non-default scale, q and k off the
unit sphere, strong decays, lengths at and within a chunk, a stream split on a chunk boundary, and a check that the
caller's tensors are left alone. Each bug below passes the gate as it stood before these checks (one scale, unit q
and k, the typical regime, the user's T only); each is now rejected at fp32 and bf16, by at least 3x its bound
where the check is a tolerance.

The bugs are planted around the op's correct ``torch_chunk`` (or inside it, by swapping one of its helpers), and
verified through the public API as a user's kernel would be.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import pytest
import torch

from deltabench.correctness.engine import verify_case
from deltabench.correctness.plan import LARGEST_CHUNK
from deltabench.harness import Case, get_impl, register_impl
from deltabench.harness import registry as _registry
from deltabench.harness.ops import OPS

# T = 100: not a chunk multiple and longer than a chunk, so only the length sweep reaches T % 64 == 0 and T <= 64.
SHAPE = {"B": 1, "T": 100, "H": 2, "K": 16, "V": 24}
C = LARGEST_CHUNK


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _factored_pairwise_decay(cum_log_decay: torch.Tensor, *, per_channel: bool) -> torch.Tensor:
    """exp(G_i - G_j) computed as exp(G_i) * exp(-G_j): right while exp(-G_j) fits in float32, inf * 0 after."""
    G = cum_log_decay
    if per_channel:
        prod = G.exp()[..., :, None, :] * (-G).exp()[..., None, :, :]
        causal = torch.ones(G.shape[-2], G.shape[-2], dtype=torch.bool).tril()[..., None]
    else:
        prod = G.exp()[..., :, None] * (-G).exp()[..., None, :]
        causal = torch.ones(G.shape[-1], G.shape[-1], dtype=torch.bool).tril()
    return prod * causal


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    return x / x.float().norm(dim=-1, keepdim=True).clamp_min(1e-6).to(x.dtype)


def planted_kernel(op: str, bug: str) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """The op's correct ``torch_chunk`` with `bug` planted in or around it."""
    correct = get_impl(op, "torch_chunk")

    def fn(q, k, v, *gates, scale=None, initial_state=None):
        T = q.shape[1]
        if bug == "ignores_scale":
            return correct(q, k, v, *gates, initial_state=initial_state)
        if bug == "normalises_qk":
            return correct(_l2norm(q), _l2norm(k), v, *gates, scale=scale, initial_state=initial_state)
        if bug == "writes_into_q":  # pre-scales q in the caller's buffer, then runs with scale 1: o is right
            with torch.no_grad():
                q.mul_(q.shape[-1] ** -0.5 if scale is None else scale)
            return correct(q, k, v, *gates, scale=1.0, initial_state=initial_state)
        if bug == "factored_decay":
            target = "gdn.torch.torch_chunk" if op == "gdn" else "common.per_channel_chunk"
            with mock.patch(f"deltabench.kernels.{target}.pairwise_decay", _factored_pairwise_decay):
                return correct(q, k, v, *gates, scale=scale, initial_state=initial_state)
        if bug == "wrong_at_chunk_multiple":  # T % C == 0: the grid misses the last chunk
            if T % C == 0:
                o, s = correct(*(x[:, : T - C] for x in (q, k, v, *gates)), scale=scale, initial_state=initial_state)
                return torch.cat([o, o.new_zeros(o.shape[0], C, *o.shape[2:])], dim=1), s
            return correct(q, k, v, *gates, scale=scale, initial_state=initial_state)
        if bug == "wrong_within_one_chunk":  # a one-chunk fast path that forgets the initial state
            return correct(q, k, v, *gates, scale=scale, initial_state=None if T <= C else initial_state)
        if bug == "state_carry":  # chunk by chunk; the state carried on gets the last decay twice
            state, outs = initial_state, []
            for start in range(0, T, C):
                part = [x[:, start : start + C] for x in (q, k, v, *gates)]
                o, state = correct(*part, scale=scale, initial_state=state)
                outs.append(o)
                if start + C < T:
                    g_last = part[3][:, -1].float()  # [B, H] or [B, H, K]
                    state = state * g_last.exp().reshape(*g_last.shape[:2], -1, 1)
            return torch.cat(outs, dim=1), state
        raise ValueError(bug)

    return fn


# bug -> (the checks that must fail, the tolerance checks among them that must fail by >= 3x, forward only)
BUGS: dict[str, tuple[set[str], set[str], bool]] = {
    "ignores_scale": ({"output"}, {"output"}, False),
    "normalises_qk": ({"output"}, {"output"}, True),
    "writes_into_q": ({"inputs_unchanged"}, set(), False),
    "factored_decay": ({"finite", "output"}, set(), False),
    "wrong_at_chunk_multiple": ({"output", "final_state"}, {"output", "final_state"}, False),
    "wrong_within_one_chunk": ({"output", "final_state"}, {"output", "final_state"}, False),
    "state_carry": ({"boundary:output"}, {"boundary:output"}, True),
}


@contextlib.contextmanager
def planted(op: str, name: str, fn: Callable[..., Any], *, forward_only: bool) -> Iterator[Any]:
    register_impl(
        op, name, backend="torch", devices=("cpu",), dtypes=("fp32", "bf16"), supports_backward=not forward_only
    )(fn)
    try:
        yield get_impl(op, name)
    finally:
        _registry._REGISTRY.pop((op, name), None)


def _worst_ratio(report: Any, check: str) -> float:
    """The failing record of `check` farthest over its bound, as a multiple of the bound."""
    values = [
        math.inf if r.value is None else r.value / r.threshold
        for r in report.failures
        if r.check == check and r.metric == "rel_fro"
    ]
    return max(values, default=0.0)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("bug", sorted(BUGS))
@pytest.mark.parametrize("op", ["gdn", "gdn2", "kda"])
def test_planted_bug_is_rejected_by_a_clear_factor(op: str, bug: str, dtype: str) -> None:
    must_fail, by_factor, forward_only = BUGS[bug]
    with planted(op, f"test_planted_{bug}", planted_kernel(op, bug), forward_only=forward_only) as impl:
        case = Case(op, **SHAPE, dtype=dtype, mode="fwd" if forward_only else "fwd+bwd")
        report = verify_case(impl, case, seeds=1, extra_seed=False)
    failed = {r.check for r in report.failures}
    assert not report.passed
    assert must_fail <= failed, f"{bug} at {dtype}: failed {sorted(failed)}"
    for check in by_factor:
        assert _worst_ratio(report, check) >= 3, (check, _worst_ratio(report, check))
    if bug == "writes_into_q":
        rec = next(r for r in report.failures if r.check == "inputs_unchanged")
        assert rec.detail == "the impl wrote into its input q"
    if bug == "factored_decay":  # the strong regime's fast heads overflow exp(-G); typical and long do not
        assert {r.regime for r in report.failures if r.check == "finite"} == {"strong"}


@pytest.mark.parametrize("bug", ["ignores_scale", "normalises_qk", "factored_decay"])
def test_bug_passes_the_old_gate(bug: str) -> None:
    """Each bug hides from the gate's former inputs (one regime, default scale, unit q and k): the new runs are
    what catch it."""
    op = "gdn"
    with planted(op, f"test_planted_{bug}", planted_kernel(op, bug), forward_only=True) as impl:
        report = verify_case(impl, Case(op, **SHAPE, dtype="bf16"), seeds=1, extra_seed=False, regimes="typical")
    old = [r for r in report.failures if "scale=" not in r.reference and "unit-norm" not in r.reference]
    assert not old, [(r.check, r.reference) for r in old]


def test_the_carry_bug_sits_under_the_oracle_bound_at_bf16() -> None:
    """The forward-only bf16 carry bug is within the oracle's bf16 bound on o and the state in the typical regime:
    the chunk-boundary stream (same impl, same rounding) is what rejects it."""
    op = "gdn"
    with planted(op, "test_planted_carry", planted_kernel(op, "state_carry"), forward_only=True) as impl:
        report = verify_case(impl, Case(op, **SHAPE, dtype="bf16"), seeds=1, extra_seed=False, regimes="typical")
    assert "boundary:output" in {r.check for r in report.failures}
    full_t = [r for r in report.records if r.metric == "rel_fro" and r.reference.startswith("oracle")]
    vs_oracle = [r for r in full_t if "scale=" in r.reference]  # unit q and k, as the old gate drew them
    assert vs_oracle and all(r.passed for r in vs_oracle)  # the old gate's view: o and the state within bounds


def test_contract_can_make_determinism_gating(monkeypatch: pytest.MonkeyPatch) -> None:
    """An op whose contract says ``deterministic`` gates on bitwise determinism without --deterministic."""
    import dataclasses

    calls = {"n": 0}
    correct = get_impl("gdn", "torch_chunk")

    def flaky(q, k, v, g, beta, scale=None, initial_state=None):
        calls["n"] += 1
        o, s = correct(q, k, v, g, beta, scale=scale, initial_state=initial_state)
        return o + calls["n"] * 1e-7 * o.abs().max(), s

    case = Case("gdn", B=1, T=20, H=2, K=8, V=8)
    loose = verify_case(flaky, case, seeds=1, extra_seed=False, regimes="typical")
    assert loose.passed
    monkeypatch.setitem(OPS, "gdn", dataclasses.replace(OPS["gdn"], deterministic=True))
    strict = verify_case(flaky, case, seeds=1, extra_seed=False, regimes="typical")
    assert {r.check for r in strict.failures} == {"determinism"}
