"""triton_chunk_auto (kernels/gdn/triton/auto.py: the forward path picked by shape) under TRITON_INTERPRET=1.

The rule at the train shapes; each path it can take (fused, split, split with segmented walks) against the float64
oracle through the auto entry point (output, final state, every gradient); the path's bits equal to the impl it
stands for; the registered impl through the harness gate.
"""

from __future__ import annotations

import pytest
import torch

from deltabench.kernels.gdn.triton import auto
from deltabench.kernels.gdn.triton.chunk import chunk_gated_delta_rule
from deltabench.kernels.gdn.triton.chunk_split import chunk_gated_delta_rule_split
from deltabench.references.gdn import gdn_recurrent, make_inputs

GATES = ("q", "k", "v", "g", "beta")
BOUND = {torch.float32: 1e-4, torch.bfloat16: 2.5e-2}


def test_rule_at_the_train_shapes() -> None:
    """The measured picks (auto.py's docstring): fused where the fused walk fills the machine at K = 128
    (8x4096x6, 4x8192x16), the serial split elsewhere (segments off), fused at one chunk."""
    assert auto.pick(8, 4096, 6) == ("fused", 1)
    assert auto.pick(4, 8192, 16) == ("fused", 1)
    assert auto.pick(1, 32768, 16) == ("split", 1)
    assert auto.pick(4, 4096, 6) == ("split", 1)
    assert auto.pick(1, 1024, 6) == ("split", 1)
    assert auto.pick(8, 4096, 6, K=64, V=64) == ("split", 1)  # the fused walk's gated launch at K = 64
    assert auto.pick(1, 64, 2)[0] == "fused"  # one chunk: nothing to walk


def test_rule_segments_when_turned_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """With segment_max_heads set, few long sequences get segmented walks, many or short ones do not."""
    monkeypatch.setitem(auto.RULE, "segment_max_heads", 16)
    assert auto.pick(1, 32768, 16) == ("split", auto.RULE["segments"])
    assert auto.pick(2, 8192, 16) == ("split", 1)  # 32 sequences
    assert auto.pick(1, 8192, 16) == ("split", 1)  # 128 chunks: under segment_min_chunks


def test_packed_takes_the_split_forward(monkeypatch: pytest.MonkeyPatch) -> None:
    """Packed, the auto entry takes the split forward whatever the shape (the measured packed rule, auto.py)."""
    from deltabench.kernels.gdn.triton import varlen

    picked: list[bool] = []

    class Spy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, g, beta, scale, initial_state, packing, split):  # type: ignore[no-untyped-def]
            picked.append(split)
            B, T, H, _ = q.shape
            return q.new_zeros(B, T, H, v.shape[-1]), q.new_zeros(packing.n, H, q.shape[-1], v.shape[-1])

    monkeypatch.setattr(varlen, "_PackedChunkFunction", Spy)
    monkeypatch.setitem(auto.RULE, "fused_min_programs", 0)  # the dense rule would take fused everywhere
    monkeypatch.setitem(auto.RULE, "fused_head_size", 32)
    x = make_inputs(1, 200, 2, 32, 32, dtype=torch.float32, seed=0)
    for lengths in ((17, 64, 1, 118), (130, 70)):
        cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
        auto.gdn_triton_chunk_auto(*(x[n] for n in GATES), cu_seqlens=cu)
    assert picked == [True, True]


def _run(fn, x, do, dht):  # type: ignore[no-untyped-def]
    leaves = {n: t.clone().requires_grad_(True) for n, t in x.items()}
    o, ht = fn(*(leaves[n] for n in GATES), initial_state=leaves.get("initial_state"))
    (o.float() * do.float()).sum().add((ht.float() * dht).sum()).backward()
    return {"o": o.detach(), "final_state": ht.detach(), **{f"grad:{n}": t.grad for n, t in leaves.items()}}


def _rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    err = (x.double() - ref).norm()
    return (err / ref.norm() if ref.norm() > 0 else err).item()


def _inputs(B, T, H, K, V, dtype, regime, seed=3):  # type: ignore[no-untyped-def]
    x = make_inputs(B, T, H, K, V, dtype=dtype, seed=seed, regime=regime, initial_state=True)
    gen = torch.Generator().manual_seed(seed + 1)
    return x, torch.randn(B, T, H, V, generator=gen).to(dtype), torch.randn(B, H, K, V, generator=gen) * 0.1


FUSED = {"fused_head_size": 32, "fused_min_programs": 0}  # the tests' K = 32 as the tuned size
PATHS = [  # (rule override, B, T, dtype, regime): each path the rule can pick, T ragged
    (FUSED, 1, 130, torch.float32, "long"),
    ({"segment_max_heads": 0}, 2, 130, torch.bfloat16, "typical"),
    ({"segment_max_heads": 100, "segment_min_chunks": 2, "segments": 3}, 1, 190, torch.float32, "typical"),
    ({"segment_max_heads": 100, "segment_min_chunks": 2, "segments": 2}, 1, 190, torch.bfloat16, "long"),
]  # fmt: skip


@pytest.mark.parametrize(("rule", "B", "T", "dtype", "regime"), PATHS)
def test_each_path_matches_oracle(rule, B, T, dtype, regime, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """Through the auto entry point: output, final state and every gradient (initial state included) against the
    float64 recurrence, H = 3, K = 32, V = 48."""
    for key, value in rule.items():
        monkeypatch.setitem(auto.RULE, key, value)
    H, K, V = 3, 32, 48
    picked = auto.pick(B, T, H, K, V)
    assert picked == (("fused", 1) if rule is FUSED else ("split", rule.get("segments", 1)))
    x, do, dht = _inputs(B, T, H, K, V, dtype, regime)
    ours = _run(auto.chunk_gated_delta_rule_auto, x, do, dht)
    ref = _run(gdn_recurrent, {n: t.double() for n, t in x.items()}, do.double(), dht.double())
    errors = {n: _rel(ours[n], ref[n]) for n in ref}
    assert all(e < BOUND[dtype] for e in errors.values()), (picked, errors)


@pytest.mark.parametrize(("fused", "impl"), [(True, chunk_gated_delta_rule), (False, chunk_gated_delta_rule_split)])
def test_same_bits_as_the_impl_it_picks(fused: bool, impl, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """Without segments the auto path is triton_chunk's or triton_chunk_split's code: the same bits, forward and
    backward, and forward-only calls too."""
    monkeypatch.setitem(auto.RULE, "fused_head_size", 32 if fused else 128)
    monkeypatch.setitem(auto.RULE, "fused_min_programs", 0)
    monkeypatch.setitem(auto.RULE, "segment_max_heads", 0)
    x, do, dht = _inputs(1, 130, 2, 32, 64, torch.bfloat16, "typical", seed=9)
    a = _run(auto.chunk_gated_delta_rule_auto, x, do, dht)
    b = _run(impl, x, do, dht)
    for name in b:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0, msg=name)
    with torch.no_grad():
        args = [x[n] for n in GATES]
        oa, ha = auto.chunk_gated_delta_rule_auto(*args, initial_state=x["initial_state"])
        ob, hb = impl(*args, initial_state=x["initial_state"])
    torch.testing.assert_close(oa, ob, rtol=0, atol=0)
    torch.testing.assert_close(ha, hb, rtol=0, atol=0)


def test_through_the_verification_engine() -> None:
    """The registered impl passes the harness gate (fp32, fwd+bwd, initial state) on the CPU interpreter."""
    from deltabench.correctness.engine import verify_case
    from deltabench.harness.cases import Case
    from deltabench.harness.registry import get_impl

    impl = get_impl("gdn", "triton_chunk_auto")
    case = Case("gdn", 1, 65, 3, 16, 32, dtype="fp32", mode="fwd+bwd", initial_state=True)
    report = verify_case(impl, case, seeds=1, extra_seed=False)
    assert report.passed, [r for r in report.records if not r.passed]
