"""deltabench's Triton chunked GDN (kernels/gdn/triton/chunk.py) against the float64 oracle, under TRITON_INTERPRET=1.

Outputs, final state and every gradient (q, k, v, g, beta, initial_state) with random cotangents on o and
the final state; T not a multiple of the chunk, H = 3, K != V, both gate regimes, with and without an
initial state. bf16 bounds are looser than the GPU gate's: Triton's CPU interpreter converts fp32 to bf16
by truncation, not rounding, which about doubles the rounding error (on the H200 the same cases measure
3e-3 to 7e-3, inside the harness's 1e-2 / 8e-3).
"""

from __future__ import annotations

import pytest
import torch

from deltabench.kernels.gdn.triton.chunk import chunk_gated_delta_rule
from deltabench.references.gdn import gdn_recurrent, make_inputs

BOUND = {torch.float32: 1e-4, torch.bfloat16: 2.5e-2}
CASES = [  # (B, T, dtype, regime, initial_state)
    (2, 1, torch.float32, "typical", True),
    (1, 63, torch.float32, "long", False),
    (1, 65, torch.float32, "typical", True),
    (1, 130, torch.float32, "long", True),
    (1, 1, torch.bfloat16, "long", False),
    (1, 63, torch.bfloat16, "typical", True),
    (2, 65, torch.bfloat16, "long", True),
    (1, 130, torch.bfloat16, "typical", False),
]


def _rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative Frobenius error; the absolute one when the reference is exactly zero (dg at T = 1, no state)."""
    err = (x.double() - ref).norm()
    return (err / ref.norm() if ref.norm() > 0 else err).item()


@pytest.mark.parametrize(
    "B,T,dtype,regime,h0", CASES, ids=[f"B{c[0]}-T{c[1]}-{str(c[2])[6:]}-{c[3]}-h0{int(c[4])}" for c in CASES]
)
def test_chunk_matches_oracle(B: int, T: int, dtype: torch.dtype, regime: str, h0: bool) -> None:
    H, K, V = 3, 32, 64
    x = make_inputs(B, T, H, K, V, dtype=dtype, seed=T, regime=regime, initial_state=h0)
    ours = {n: t.clone().requires_grad_(True) for n, t in x.items()}
    ref = {n: t.double().requires_grad_(True) for n, t in x.items()}
    gen = torch.Generator().manual_seed(7)
    do = torch.randn(B, T, H, V, generator=gen).to(dtype)
    dht = torch.randn(B, H, K, V, generator=gen) * 0.1

    o, ht = chunk_gated_delta_rule(
        *(ours[n] for n in ("q", "k", "v", "g", "beta")), initial_state=ours.get("initial_state")
    )
    (o.float() * do.float()).sum().add((ht * dht).sum()).backward()
    ro, rht = gdn_recurrent(*(ref[n] for n in ("q", "k", "v", "g", "beta")), initial_state=ref.get("initial_state"))
    (ro * do.double()).sum().add((rht * dht.double()).sum()).backward()

    assert o.dtype == dtype and o.shape == (B, T, H, V)
    assert ht.dtype == torch.float32 and ht.shape == (B, H, K, V)
    bound = BOUND[dtype]
    errors = {"o": _rel(o, ro), "final_state": _rel(ht, rht)}
    errors.update({f"grad:{n}": _rel(ours[n].grad, ref[n].grad) for n in ours})
    assert all(e < bound for e in errors.values()), errors


def test_forward_only_path_matches_autograd_path() -> None:
    """Without gradients the forward skips storing per-chunk states; the outputs must not change."""
    x = make_inputs(1, 70, 2, 16, 32, seed=3, initial_state=True)
    args = [x[n] for n in ("q", "k", "v", "g", "beta")]
    with torch.no_grad():
        o1, h1 = chunk_gated_delta_rule(*args, initial_state=x["initial_state"])
    o2, h2 = chunk_gated_delta_rule(*(a.clone().requires_grad_(True) for a in args), initial_state=x["initial_state"])
    torch.testing.assert_close(o1, o2.detach(), rtol=0, atol=0)
    torch.testing.assert_close(h1, h2.detach(), rtol=0, atol=0)


def test_through_the_verification_engine() -> None:
    """The registered impl passes the harness gate (fp32, fwd+bwd) on the CPU interpreter."""
    from deltabench.correctness.engine import verify_case
    from deltabench.harness.cases import Case
    from deltabench.harness.registry import get_impl

    case = Case("gdn", 1, 65, 3, 16, 32, dtype="fp32", mode="fwd+bwd", initial_state=True)
    report = verify_case(get_impl("gdn", "triton_chunk"), case, seeds=1, extra_seed=False)
    assert report.passed, [r for r in report.records if not r.passed]
    assert any(r.check.startswith("grad:") for r in report.records)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_local_bwd_in_three_launches_matches_one(dtype: torch.dtype) -> None:
    """local_bwd's split (query side and state update, W and U, then A; dk and dg's terms passed in fp32, dA
    through L's unused upper triangle) gives one launch's gradients up to the order of fp32 sums: same inputs,
    T = 130 (a partial last chunk), K != V, a gradient on the final state (so the last chunk's state-update
    term of dg, which sits on its last valid row, is not zero)."""
    from deltabench.kernels.gdn.triton.local_bwd import local_bwd
    from deltabench.kernels.gdn.triton.state import state_bwd, state_fwd
    from deltabench.kernels.gdn.triton.wy import wy_fwd

    B, T, H, K, V = 1, 130, 2, 32, 64
    x = make_inputs(B, T, H, K, V, dtype=dtype, seed=5, regime="long", initial_state=True)
    q, k, v, beta = (x[n] for n in ("q", "k", "v", "beta"))
    g = x["g"].float()
    do = torch.randn(B, T, H, V, generator=torch.Generator().manual_seed(3)).to(dtype)
    L, w, u = wy_fwd(k, v, g, beta)
    _, _, h, vnew = state_fwd(q, k, w, u, g, K**-0.5, x["initial_state"], False, True)
    dht = torch.randn(B, H, K, V, generator=torch.Generator().manual_seed(4)) * 0.1
    dh, dvnew, _ = state_bwd(q, k, w, g, do, dht, K**-0.5)
    args = (q, k, v, g, beta, L, h, dh, vnew, dvnew, do, K**-0.5)
    C = L.shape[-1]
    lower = (torch.arange(C)[None, :] <= (torch.arange(T) % C)[:, None])[:, None, :]  # [T, 1, C]: L's own part
    L_before = L[:, lower.expand(T, H, C)].clone()
    one = local_bwd(*args, config=(64, 4, 1, False))
    two = local_bwd(*args, config=(64, 4, 1, True))
    torch.testing.assert_close(L[:, lower.expand(T, H, C)], L_before, rtol=0, atol=0)  # L itself is kept
    again = local_bwd(*args, config=(64, 4, 1, True))  # a second backward from the same saved tensors
    for name, a, b, c in zip(("dq", "dk", "dv", "dg", "dbeta"), one, two, again, strict=True):
        torch.testing.assert_close(c, b, rtol=0, atol=0)
        assert torch.isfinite(b).all(), name
        assert _rel(b, a.double()) < (1e-6 if dtype == torch.float32 else 1e-2), name


def test_chunk_matches_oracle_with_local_bwd_split(monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole fwd+bwd with local_bwd in three launches, against the float64 oracle (fp32, h0, T = 65).

    The library splits at K = 128 (wy.TUNED_K) only; this test's K = 32 is made the tuned size here."""
    from deltabench.kernels.gdn.triton import local_bwd

    monkeypatch.setitem(local_bwd.LAUNCH, "split", True)
    monkeypatch.setattr(local_bwd, "TUNED_K", 32)
    calls = []
    monkeypatch.setattr(local_bwd, "local_bwd_kernel", _Recorder(local_bwd.local_bwd_kernel, calls))
    test_chunk_matches_oracle(1, 65, torch.float32, "typical", True)
    assert calls == [1, 2, 3]  # the three launches ran, in order


class _Recorder:
    """Stands in for a Triton kernel: records each launch's PART, then launches the kernel."""

    def __init__(self, kernel, calls: list) -> None:  # type: ignore[no-untyped-def]
        self.kernel, self.calls = kernel, calls

    def __getitem__(self, grid):  # type: ignore[no-untyped-def]
        def launch(*args, **kwargs):  # type: ignore[no-untyped-def]
            self.calls.append(kwargs["PART"])
            return self.kernel[grid](*args, **kwargs)

        return launch


def test_head_sizes_outside_the_sweep_keep_the_gated_launches() -> None:
    """state_bwd's tuned classes only at K = 128 (where they were measured on the H200); at K = 64 a v2
    config faulted there, so other sizes keep the config the GPU gate passed before."""
    from deltabench.kernels.gdn.triton.state import bwd_launch_config

    assert bwd_launch_config(128, 6, 64, NT=64) == (64, 8, 1)
    assert bwd_launch_config(128, 6, 256, NT=64) == (64, 8, 1)
    assert bwd_launch_config(128, 6, 128, NT=64) == (16, 4, 3)  # narrow: 12 programs at 64 columns
    assert bwd_launch_config(128, 48, 128, NT=64) == (64, 4, 2)  # wide: 96 programs


def test_walks_shorter_than_the_pipeline_keep_the_single_stage_launch() -> None:
    """A tuned config pipelines its chunk loop over 2 or 3 stages; with fewer chunks than stages the H200 gave
    a wrong dh0 (the narrow config at T = 64), so such walks take the gated single-stage config."""
    from deltabench.kernels.gdn.triton.state import bwd_launch_config

    assert bwd_launch_config(128, 2, 128, NT=1) == (64, 8, 1)
    assert bwd_launch_config(128, 2, 128, NT=2) == (64, 8, 1)
    assert bwd_launch_config(128, 2, 128, NT=3) == (16, 4, 3)
    assert bwd_launch_config(128, 48, 128, NT=1) == (64, 8, 1)
    assert bwd_launch_config(128, 48, 128, NT=2) == (64, 4, 2)


def test_fused_forward_walk_launch_config() -> None:
    """state_fwd's tuned configs (state.FWD_LAUNCH, H200 2026-12-03) at K = 128 only: 16 columns for few programs,
    64 otherwise, 3 stages; fewer chunks than stages, V under 64 or another head size: the gated 64/8/1 (16/4/1)."""
    from deltabench.kernels.gdn.triton.state import fwd_launch_config

    assert fwd_launch_config(128, 6, 128, NT=16) == (16, 4, 3)  # 1 x 1024 x 6: 12 programs at 64 columns
    assert fwd_launch_config(128, 24, 128, NT=64) == (64, 4, 3)  # 4 x 4096 x 6: 48 programs
    assert fwd_launch_config(128, 64, 128, NT=128) == (64, 4, 3)
    assert fwd_launch_config(128, 64, 128, NT=2) == (64, 8, 1)  # fewer chunks than stages
    assert fwd_launch_config(128, 64, 64, NT=128) == (64, 8, 1)  # K = 64: the gated config
    assert fwd_launch_config(32, 64, 128, NT=128) == (16, 4, 1)  # V under 64
