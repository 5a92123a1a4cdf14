"""opengdn's conventions (alpha = exp(g), state [B,H,V,K], unscaled q, one dtype) are bridged correctly.

The first test runs opengdn's documented rule, written out here in float64, on the adapter's mapped inputs and
compares with deltabench's float64 oracle, so the mapping is checked where opengdn is not installed. The second runs
the real opengdn (CPU chunkwise path) through the registered impl when the package is there.
"""

from __future__ import annotations

import pytest
import torch

from deltabench.kernels.external.opengdn import from_opengdn_state, to_opengdn
from deltabench.references.gdn import gdn_recurrent, make_inputs


def _opengdn_rule(q, k, v, alpha, beta, state):
    """opengdn 0.1.0's rule as its docstring states it: S_t = alpha_t (S - beta_t (S k_t) k_t^T) + beta_t v_t k_t^T,
    o_t = S_t q_t, with S [B, H, V, K]."""
    B, T, H, K = q.shape
    S = q.new_zeros(B, H, v.shape[-1], K) if state is None else state
    outs = []
    for t in range(T):
        a, b = alpha[:, t, :, None, None], beta[:, t, :, None, None]
        kt, vt = k[:, t], v[:, t]
        Sk = torch.einsum("bhvk,bhk->bhv", S, kt)
        S = a * (S - b * Sk[..., None] * kt[..., None, :]) + b * vt[..., None] * kt[..., None, :]
        outs.append(torch.einsum("bhvk,bhk->bhv", S, q[:, t]))
    return torch.stack(outs, dim=1), S


@pytest.mark.parametrize("with_state", [False, True], ids=["no-h0", "h0"])
def test_mapping_reproduces_the_oracle(with_state):
    x = make_inputs(2, 37, 3, 8, 12, dtype=torch.float64, seed=3, initial_state=with_state)
    x = {n: t.double().requires_grad_(True) for n, t in x.items()}
    q_s, alpha, beta, state = to_opengdn(x["q"], x["g"], x["beta"], None, x.get("initial_state"))
    assert q_s.is_contiguous() and alpha.is_contiguous() and (state is None or state.is_contiguous())
    assert alpha.dtype == beta.dtype == q_s.dtype == torch.float64
    o, s_vk = _opengdn_rule(q_s, x["k"], x["v"], alpha, beta, state)
    s = from_opengdn_state(s_vk)
    o_ref, s_ref = gdn_recurrent(**x)
    assert s.dtype == torch.float32 and s.shape == s_ref.shape
    torch.testing.assert_close(o, o_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(s.double(), s_ref, rtol=1e-6, atol=1e-6)
    # Gradients reach deltabench's own inputs (g through exp, the state through the transpose).
    do = torch.randn_like(o_ref)
    grads = torch.autograd.grad((o * do).sum(), list(x.values()))
    grads_ref = torch.autograd.grad((o_ref * do).sum(), list(x.values()))
    for name, got, want in zip(x, grads, grads_ref, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9, msg=f"d{name}")


@pytest.mark.parametrize("regime", ["typical", "long"])
def test_real_opengdn_chunkwise_matches_the_oracle_forward(regime):
    pytest.importorskip("opengdn")
    from deltabench.harness.registry import get_impl

    x = make_inputs(2, 100, 3, 16, 24, dtype=torch.float32, seed=1, regime=regime, initial_state=True)
    o, s = get_impl("gdn", "opengdn_chunkwise")(**x)
    o_ref, s_ref = gdn_recurrent(**x)
    assert o.dtype == torch.float32 and s.shape == s_ref.shape
    torch.testing.assert_close(o.double(), o_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(s.double(), s_ref, rtol=1e-5, atol=1e-5)


def test_the_gate_rejects_opengdn_at_slow_decays_in_bf16():
    """opengdn takes the decay as a factor alpha = exp(g) in the inputs' dtype: in bf16 every alpha within 2^-9 of 1
    (log-decays in about [-2e-3, 0], a long-memory head) rounds to 1, no decay at all, so the strong regime's
    near-zero heads drift from the oracle along T. The typical regime's decays survive the cast and pass."""
    pytest.importorskip("opengdn")
    from deltabench.correctness.engine import verify_case
    from deltabench.harness.cases import Case
    from deltabench.harness.registry import get_impl

    assert torch.exp(torch.tensor(-1e-3)).to(torch.bfloat16).item() == 1.0
    impl = get_impl("gdn", "opengdn_chunkwise")
    case = Case("gdn", B=1, T=130, H=2, K=32, V=32, dtype="bf16", mode="fwd", device="cpu")
    strong = verify_case(impl, case, seeds=1, extra_seed=False, regimes="strong")
    failed = {(r.check, r.regime) for r in strong.failures}
    assert {("output", "strong"), ("final_state", "strong")} <= failed, failed
    states = [r for r in strong.records if r.check == "final_state" and r.metric == "rel_fro"]
    worst_state = max(states, key=lambda r: r.value)
    assert worst_state.value > 2 * worst_state.threshold
    assert worst_state.worst_index[1] % 2 == 1  # an odd head: the strong regime's near-zero log-decays
    assert verify_case(impl, case, seeds=1, extra_seed=False, regimes="typical").passed
