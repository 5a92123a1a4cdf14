"""triton_chunk_split (kernels/gdn/triton/chunk_split.py: WY, state walk, parallel output) under TRITON_INTERPRET=1.

Against the float64 oracle: outputs, final state and every gradient (q, k, v, g, beta, initial_state) with
random cotangents on o and the final state; T = 1, 63, 65, 130 (partial last chunks), H = 3, K != V, fp32
and bf16, both gate regimes, with and without an initial state. bf16 bounds are test_triton_chunk.py's
(the interpreter truncates fp32 to bf16 instead of rounding). Against ``triton_chunk``: the same arithmetic,
so on the interpreter the same bits. Through the harness gate: the registered impl passes ``verify_case``.
The walk picks 16-column V blocks for few heads (every case here by default); ``wide_walk`` lowers its
program threshold so that the 64-column blocks of the large shapes run too.
"""

from __future__ import annotations

import pytest
import torch

from deltabench.kernels.gdn.triton import walk
from deltabench.kernels.gdn.triton.chunk import chunk_gated_delta_rule
from deltabench.kernels.gdn.triton.chunk_split import chunk_gated_delta_rule_split
from deltabench.references.gdn import gdn_recurrent, make_inputs

BOUND = {torch.float32: 1e-4, torch.bfloat16: 2.5e-2}
GATES = ("q", "k", "v", "g", "beta")
CASES = [  # (B, T, dtype, regime, initial_state, walk V block)
    (2, 1, torch.float32, "typical", True, 16),
    (1, 63, torch.float32, "long", False, 64),
    (1, 65, torch.float32, "typical", True, 16),
    (1, 130, torch.float32, "long", True, 64),
    (1, 1, torch.bfloat16, "long", False, 64),
    (1, 63, torch.bfloat16, "typical", True, 16),
    (2, 65, torch.bfloat16, "long", True, 64),
    (1, 130, torch.bfloat16, "typical", False, 16),
]


@pytest.fixture
def walk_block(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> int:
    """The walk's V block for this test (16: the default at these few heads; 64: threshold lowered to 1).

    The walk's tuned classes apply at the head size they were measured at (wy.TUNED_K = 128); these tests
    run K = 32, so that size is moved to 32 here to exercise both blocks."""
    monkeypatch.setattr(walk, "TUNED_K", 32)
    if request.param == 64:
        monkeypatch.setitem(walk.LAUNCH, "min_programs", 1)
    return request.param


def _rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative Frobenius error; the absolute one when the reference is exactly zero (dg at T = 1, no state)."""
    err = (x.double() - ref).norm()
    return (err / ref.norm() if ref.norm() > 0 else err).item()


def _run(fn, x: dict[str, torch.Tensor], do: torch.Tensor, dht: torch.Tensor) -> dict[str, torch.Tensor]:
    """o, final state and every input's gradient of ``fn`` on fresh leaves of `x`."""
    leaves = {n: t.clone().requires_grad_(True) for n, t in x.items()}
    o, ht = fn(*(leaves[n] for n in GATES), initial_state=leaves.get("initial_state"))
    (o.float() * do.float()).sum().add((ht.float() * dht).sum()).backward()
    return {"o": o.detach(), "final_state": ht.detach(), **{f"grad:{n}": t.grad for n, t in leaves.items()}}


def draw_cotangents(B: int, T: int, H: int, K: int, V: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    return torch.randn(B, T, H, V, generator=gen).to(dtype), torch.randn(B, H, K, V, generator=gen) * 0.1


def _check_against_oracle(B: int, T: int, H: int, K: int, V: int, dtype, regime: str, h0: bool) -> None:
    x = make_inputs(B, T, H, K, V, dtype=dtype, seed=T, regime=regime, initial_state=h0)
    do, dht = draw_cotangents(B, T, H, K, V, dtype)
    ours = _run(chunk_gated_delta_rule_split, x, do, dht)
    ref = _run(gdn_recurrent, {n: t.double() for n, t in x.items()}, do.double(), dht.double())

    assert ours["o"].dtype == dtype and ours["o"].shape == (B, T, H, V)
    assert ours["final_state"].dtype == torch.float32 and ours["final_state"].shape == (B, H, K, V)
    assert set(ours) == set(ref) and ("grad:initial_state" in ours) == h0
    errors = {name: _rel(ours[name], ref[name]) for name in ref}
    assert all(e < BOUND[dtype] for e in errors.values()), errors


@pytest.mark.parametrize(
    "B,T,dtype,regime,h0,walk_block",
    CASES,
    ids=[f"B{c[0]}-T{c[1]}-{str(c[2])[6:]}-{c[3]}-h0{int(c[4])}-walk{c[5]}" for c in CASES],
    indirect=["walk_block"],
)
def test_split_matches_oracle(B: int, T: int, dtype: torch.dtype, regime: str, h0: bool, walk_block: int) -> None:
    """K = 32, V = 64: the output stage takes one 64-column V block, the walk `walk_block` columns."""
    assert walk.launch_config(64, B * 3, 32)[0] == walk_block
    _check_against_oracle(B, T, 3, 32, 64, dtype, regime, h0)


def test_split_matches_oracle_at_padded_dims() -> None:
    """K = 24, V = 20: tiles padded to 32 and 16 columns, two masked 16-column V blocks in walk and output."""
    _check_against_oracle(1, 70, 2, 24, 20, torch.float32, "long", True)


SEGMENTED = [  # (B, T, H, K, V, segments, dtype, initial state): T ragged, at a chunk multiple, segments > chunks
    (1, 300, 3, 32, 16, 3, torch.float32, True),
    (2, 130, 1, 32, 48, 2, torch.float32, False),
    (1, 256, 2, 24, 20, 4, torch.float32, True),
    (1, 200, 1, 32, 32, 9, torch.float32, True),
    (1, 300, 2, 32, 32, 4, torch.bfloat16, True),
    (2, 190, 3, 32, 64, 2, torch.bfloat16, False),
]


@pytest.mark.parametrize(("B", "T", "H", "K", "V", "segments", "dtype", "h0"), SEGMENTED)
def test_segmented_walk_gives_the_serial_walks_results(B, T, H, K, V, segments, dtype, h0) -> None:  # type: ignore[no-untyped-def]
    """The segmented walk (segment maps, their composition, the segments' walks side by side) against the serial
    walk: h, v_new and the final state to fp32 rounding at fp32, to bf16 rounding at bf16 (the segment starts are
    composed rather than walked, so the states' bf16 rounding falls elsewhere)."""
    from deltabench.kernels.gdn.triton.wy import wy_fwd

    x = make_inputs(B, T, H, K, V, dtype=dtype, seed=T + segments, regime="long", initial_state=h0)
    _, w, u = wy_fwd(x["k"], x["v"], x["g"].float(), x["beta"])
    args = (x["k"], w, u, x["g"].float(), x.get("initial_state"), True)
    serial = walk.state_walk(*args)
    segmented = walk.state_walk(*args, segments=segments)
    bound = 1e-6 if dtype == torch.float32 else 4e-3
    for name, a, b in zip(("h", "v_new", "final_state"), serial, segmented, strict=True):
        assert b.dtype == a.dtype and b.shape == a.shape, name
        assert _rel(b, a.double()) < bound, (name, _rel(b, a.double()))
    # without the final state: none returned, h and v_new the same
    h, vnew, ht = walk.state_walk(*args[:-1], False, segments=segments)
    assert ht is None and torch.equal(h, segmented[0]) and torch.equal(vnew, segmented[1])


@pytest.mark.parametrize(("B", "T", "H", "K", "V", "segments", "dtype", "h0"), SEGMENTED)
def test_segmented_backward_walk_gives_the_serial_walks_results(B, T, H, K, V, segments, dtype, h0) -> None:  # type: ignore[no-untyped-def]
    """state.py's backward walk, segmented, against the serial one: dh, dv_new and dh0 (`h0` here: a cotangent on
    the final state or none)."""
    from deltabench.kernels.gdn.triton import state
    from deltabench.kernels.gdn.triton.wy import wy_fwd

    x = make_inputs(B, T, H, K, V, dtype=dtype, seed=T + segments, regime="long")
    _, w, _ = wy_fwd(x["k"], x["v"], x["g"].float(), x["beta"])
    do, dht = draw_cotangents(B, T, H, K, V, dtype)
    args = (x["q"], x["k"], w, x["g"].float(), do, dht if h0 else None, K**-0.5)
    serial = state.state_bwd(*args)
    segmented = state.state_bwd(*args, segments=segments)
    bound = 1e-6 if dtype == torch.float32 else 4e-3
    for name, a, b in zip(("dh", "dv_new", "dh0"), serial, segmented, strict=True):
        assert b.dtype == a.dtype and b.shape == a.shape, name
        assert _rel(b, a.double()) < bound, (name, _rel(b, a.double()))


@pytest.mark.parametrize(("dtype", "regime"), [(torch.float32, "long"), (torch.bfloat16, "typical")])
def test_split_with_the_segmented_walk_matches_oracle(dtype, regime, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """The whole op through the segmented walks, forward and backward (three segments of T = 190's three chunks:
    one chunk a segment, the last ragged), against the float64 oracle: output, final state, every gradient."""
    monkeypatch.setattr(walk, "SEGMENTS", 3)
    _check_against_oracle(1, 190, 3, 32, 64, dtype, regime, True)


@pytest.mark.parametrize("walk_block", [16, 64], indirect=True)
def test_same_bits_as_triton_chunk(walk_block: int) -> None:
    """Same products in the same order as chunk.py's forward, and its backward: identical on the interpreter
    (chunk.py's walk takes 64-column blocks here; with 16-column ones only the fp32 final state's last bits move)."""
    B, T, H, K, V = 1, 130, 3, 32, 64
    x = make_inputs(B, T, H, K, V, dtype=torch.bfloat16, seed=11, initial_state=True)
    do, dht = draw_cotangents(B, T, H, K, V, torch.bfloat16)
    split = _run(chunk_gated_delta_rule_split, x, do, dht)
    fused = _run(chunk_gated_delta_rule, x, do, dht)
    for name in fused:
        if name == "final_state" and walk_block == 16:
            # the fp32 state's last update sums its products in another order with 16-column tiles
            assert _rel(split[name], fused[name].double()) < 1e-7
            continue
        torch.testing.assert_close(split[name], fused[name], rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("T", [1, 64])
def test_one_chunk_takes_the_fused_forward(T: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """At one chunk the walk is never launched (its pipelined launch faulted there on the H200, where the
    interpreter does not pipeline): chunk.py's forward runs instead, so every result has chunk.py's bits."""
    from deltabench.kernels.gdn.triton import chunk_split

    def no_walk(*args: object, **kwargs: object) -> None:
        raise AssertionError("state_walk launched for a one-chunk sequence")

    monkeypatch.setattr(chunk_split.walk, "state_walk", no_walk)
    B, H, K, V = 1, 2, 32, 64
    x = make_inputs(B, T, H, K, V, dtype=torch.bfloat16, seed=5, initial_state=True)
    do, dht = draw_cotangents(B, T, H, K, V, torch.bfloat16)
    split = _run(chunk_gated_delta_rule_split, x, do, dht)
    fused = _run(chunk_gated_delta_rule, x, do, dht)
    for name in fused:
        torch.testing.assert_close(split[name], fused[name], rtol=0, atol=0, msg=name)
    with pytest.raises(AssertionError, match="state_walk launched"):
        _run(
            chunk_gated_delta_rule_split,
            make_inputs(B, 65, H, K, V, dtype=torch.bfloat16, seed=5),
            *draw_cotangents(B, 65, H, K, V, torch.bfloat16),
        )


def test_walk_launch_config() -> None:
    """64-column blocks in 4 stages when they fill the machine, 16 columns in 3 otherwise; 4 warps; 2 stages when
    the walk has fewer chunks than that (H200 measurements, walk.LAUNCH)."""
    assert walk.launch_config(128, 48) == (64, 4, 4)  # 8 x 4096 x 6: 96 programs
    assert walk.launch_config(128, 64, NT=128) == (64, 4, 4)  # 4 x 8192 x 16: 128 programs
    assert walk.launch_config(128, 16, NT=512) == (16, 4, 3)  # 1 x 32768 x 16: 32 programs at 64 columns, 128 at 16
    assert walk.launch_config(20, 1000) == (16, 4, 3)  # V under 64 (padded to 32)
    assert walk.launch_config(48, 1000) == (64, 4, 4)  # padded to 64, masked
    assert walk.launch_config(128, 64, NT=3) == (64, 4, 2)  # fewer chunks than stages
    assert walk.launch_config(128, 16, NT=2) == (16, 4, 2)
    assert walk.launch_config(128, 16, NT=3) == (16, 4, 3)
    assert walk.launch_config(128, 16, BK=64) == (64, 8, 1)  # K = 64: state_fwd's gated config, not the tuned
    assert walk.launch_config(32, 16, BK=256) == (16, 4, 2)


@pytest.mark.parametrize("V", [16, 20, 32, 48, 64, 100, 128, 256])
@pytest.mark.parametrize("heads", [1, 6, 7, 16, 24, 48, 64, 999])
@pytest.mark.parametrize("BK", [16, 64, 128, 256])
def test_walk_never_launches_a_config_that_faulted_on_the_h200(V: int, heads: int, BK: int) -> None:
    """The interpreter cannot see a compiler's shared-memory fault, so the launch table is checked instead:
    no V block of 32 columns (state.py's fault), no 16-column block in one stage (the walk's fault on the
    H200, Triton 3.6: out-of-range shared-memory reads at the first tl.dot, garbage h, then an illegal access),
    and only (V block, warps, stages) triples that ran clean and exact there (benchmarks/NOTES.md)."""
    assert walk.launch_config(V, heads, BK) in walk.H200_CLEAN


def test_forward_only_path_matches_autograd_path() -> None:
    """Without gradients nothing is saved for the backward; the outputs must not change."""
    x = make_inputs(1, 70, 2, 16, 32, seed=3, initial_state=True)
    args = [x[n] for n in GATES]
    with torch.no_grad():
        o1, h1 = chunk_gated_delta_rule_split(*args, initial_state=x["initial_state"])
        o0, h0 = chunk_gated_delta_rule_split(*args, initial_state=x["initial_state"], output_final_state=False)
    o2, h2 = chunk_gated_delta_rule_split(
        *(a.clone().requires_grad_(True) for a in args), initial_state=x["initial_state"]
    )
    torch.testing.assert_close(o1, o2.detach(), rtol=0, atol=0)
    torch.testing.assert_close(h1, h2.detach(), rtol=0, atol=0)
    torch.testing.assert_close(o0, o1, rtol=0, atol=0)
    assert h0 is None


def test_through_the_verification_engine() -> None:
    """The registered impl passes the harness gate (fp32, fwd+bwd, initial state) on the CPU interpreter."""
    from deltabench.correctness.engine import verify_case
    from deltabench.harness.cases import Case
    from deltabench.harness.registry import get_impl

    impl = get_impl("gdn", "triton_chunk_split")
    assert "split forward" in impl.notes
    case = Case("gdn", 1, 65, 3, 16, 32, dtype="fp32", mode="fwd+bwd", initial_state=True)
    report = verify_case(impl, case, seeds=1, extra_seed=False)
    assert report.passed, [r for r in report.records if not r.passed]
    grads = {"grad:q", "grad:k", "grad:v", "grad:g", "grad:beta", "grad:initial_state"}
    assert grads <= {r.check for r in report.records}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tuned_head_size_takes_the_gpu_path(dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    """K = V = 128 (wy.TUNED_K), untouched launch tables: the code path the H200 runs at the train shapes, with
    local_bwd in its three launches at its tuned V block (the interpreter ignores warps and stages, not the
    parts, blocks and constexprs). T = 130: a partial last chunk, with a gradient on the final state."""
    from deltabench.kernels.gdn.triton import local_bwd

    launches: list[tuple[int, int, int, int]] = []
    kernel = local_bwd.local_bwd_kernel

    class Recorder:
        def __getitem__(self, grid):  # type: ignore[no-untyped-def]
            def launch(*args, **kwargs):  # type: ignore[no-untyped-def]
                launches.append((kwargs["PART"], kwargs["BV"], kwargs["num_warps"], kwargs["num_stages"]))
                return kernel[grid](*args, **kwargs)

            return launch

    monkeypatch.setattr(local_bwd, "local_bwd_kernel", Recorder())
    _check_against_oracle(1, 130, 2, 128, 128, dtype, "long", True)
    cfg = local_bwd.LAUNCH
    assert cfg["split"]
    assert launches == [(part, *cfg["parts"][part - 1]) for part in (1, 2, 3)]
