"""Packed variable-length batches (cu_seqlens, FLA's convention): the case, the per-sequence oracle, the gate's
per-sequence comparison, the impls that take them, and bugs at sequence boundaries that the gate must reject.

The planted bugs are the ways a varlen kernel goes wrong at a boundary: a state carried over it, a chunk straddling
it (a boundary inside a chunk, the chunk run whole as its first sequence's), and a length-1 sequence mishandled.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest
import torch

from deltabench.correctness.engine import verify_case
from deltabench.harness import Case, get_impl, get_op
from deltabench.harness.errors import BadInput
from deltabench.harness.ops import make_case_inputs
from deltabench.harness.seqlens import draw_seqlens, parse_seqlens, prefix_seqlens
from deltabench.kernels.gdn.torch.torch_recurrent import gdn_torch_recurrent
from deltabench.references._varlen import by_sequence

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# Boundaries at 17, 81 and 82 lie inside 64-token chunks; the third sequence is one token long.
SEQLENS = (17, 64, 1, 68)
SHAPE = {"B": 1, "T": sum(SEQLENS), "H": 2, "K": 16, "V": 16}
CHUNK = 64


def packed_case(op: str = "gdn", **fields: object) -> Case:
    return Case(op, **SHAPE, seqlens=SEQLENS, **fields)


def gate(fn: Callable[..., object], case: Case, **kw: object) -> object:
    return verify_case(fn, case, seeds=1, extra_seed=False, **kw)


# ------------------------------------------------------------------------------------------------ the case


def test_a_packed_case_names_n_and_keeps_its_lengths() -> None:
    case = packed_case(mode="fwd+bwd")
    assert case.shape_id == "B1-T150-H2-K16-V16-N4"
    assert case.state_dims["B"] == 4
    again = Case(**case.to_dict())
    assert again == case and again.seqlens == SEQLENS
    drawn, spelled = draw_seqlens("lognormal(mean=20, sigma=1.0, total=150, seed=0)", 150)
    assert sum(drawn) == 150 and min(drawn) >= 1
    assert draw_seqlens("lognormal(mean=20, sigma=1.0, total=150, seed=0)", 150)[0] == drawn  # seeded
    drawn_case = Case("gdn", **SHAPE, seqlens=drawn, seqlens_from=spelled)
    assert drawn_case.shape_id == f"B1-T150-H2-K16-V16-N{len(drawn)}-lognormal(mean=20,sigma=1,total=150,seed=0)"


def test_a_shorter_packed_case_keeps_the_sequences_of_its_first_tokens() -> None:
    assert prefix_seqlens(SEQLENS, 128) == (17, 64, 1, 46)
    assert packed_case().replace(T=64).seqlens == (17, 47)
    assert packed_case().replace(T=1).seqlens == (1,)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"seqlens": (17, 64)}, "sum to 81, not T=150"),
        ({"seqlens": (150,), "B": 2}, "take B=1"),
        ({"seqlens": (0, 150)}, "at least 1"),
    ],
)
def test_bad_lengths_are_bad_input(fields: dict, message: str) -> None:
    with pytest.raises(BadInput, match=message):
        Case("gdn", **{**SHAPE, **{k: v for k, v in fields.items() if k != "seqlens"}}, seqlens=fields["seqlens"])


def test_lengths_parse_and_a_bad_list_or_distribution_is_bad_input() -> None:
    assert parse_seqlens("17,64,1,218") == (17, 64, 1, 218)
    for bad in ("17,,3", "17,-1", "a"):
        with pytest.raises(BadInput):
            parse_seqlens(bad)
    with pytest.raises(BadInput, match="equal the shape's T"):
        draw_seqlens("lognormal(mean=20, total=100)", 150)
    with pytest.raises(BadInput):
        draw_seqlens("zipf(a=2)", 150)


def test_an_op_without_packed_sequences_refuses_them() -> None:
    with pytest.raises(BadInput, match="does not take packed sequences"):
        Case("sdm", B=1, T=8, H=1, S=16, D=8, R=2, W=2, seqlens=(4, 4))


def test_an_impl_that_does_not_take_cu_seqlens_is_refused_with_the_reason() -> None:
    impl = get_impl("gdn", "jax_chunk")
    assert not impl.varlen
    assert "does not take cu_seqlens" in (impl.check_case(packed_case()) or "")
    assert impl.check_case(Case("gdn", **SHAPE)) != impl.check_case(packed_case())
    assert get_impl("gdn", "triton_chunk").varlen and get_impl("gdn", "torch_chunk").varlen


def test_the_inputs_carry_offsets_and_a_state_row_per_sequence() -> None:
    x = make_case_inputs(get_op("gdn"), packed_case(initial_state=True))
    assert x["cu_seqlens"].dtype == torch.int32 and x["cu_seqlens"].tolist() == [0, 17, 81, 82, 150]
    assert list(x["initial_state"].shape) == [4, 2, 16, 16]
    assert list(x["q"].shape) == [1, 150, 2, 16]


# ------------------------------------------------------------------------------------------------ the oracle


def test_the_packed_oracle_equals_the_dense_oracle_on_equal_lengths() -> None:
    """Four sequences of 25 packed in one row against the same four as a dense batch of four rows."""
    spec = get_op("gdn")
    dense = spec.make_inputs(4, 25, 2, 8, 8, dtype=torch.float64, initial_state=True)
    o, ht = spec.oracle(**dense)
    packed = {n: x.reshape(1, 100, *x.shape[2:]) for n, x in dense.items() if n != "initial_state"}
    offsets = torch.tensor([0, 25, 50, 75, 100], dtype=torch.int32)
    po, pht = by_sequence(spec)(
        *(packed[n] for n in spec.args), initial_state=dense["initial_state"], cu_seqlens=offsets
    )
    torch.testing.assert_close(po, o.reshape(1, 100, 2, 8), rtol=0, atol=0)
    torch.testing.assert_close(pht, ht, rtol=0, atol=0)


# ------------------------------------------------------------------------------------------------ impls pass


@pytest.mark.parametrize(
    ("op", "name"),
    [("gdn", "torch_chunk"), ("gdn", "torch_recurrent"), ("gdn2", "torch_chunk"), ("kda", "torch_chunk")],
)
def test_torch_references_pass_the_packed_gate(op: str, name: str) -> None:
    report = gate(get_impl(op, name), packed_case(op, mode="fwd+bwd"))
    assert report.passed, [(r.check, r.value, r.detail) for r in report.failures]
    checks = {r.check for r in report.records}
    assert {"output", "final_state", "grad:initial_state", "grad:q", "grad:g"} <= checks


@pytest.mark.parametrize("op", ["gdn", "gdn2", "kda"])
def test_torch_chunk_packed_is_each_sequence_alone(op: str) -> None:
    """torch_chunk on a packing (chunks of 16: 1 to 25 chunks a sequence, one of a single token) against the same
    impl on each sequence alone: outputs, final states and every gradient, from an initial state."""
    impl = get_impl(op, "torch_chunk")
    lengths = (1, 70, 400, 129)
    case = Case(op, B=1, T=sum(lengths), H=3, K=16, V=8, seqlens=lengths, mode="fwd+bwd", seed=3)
    x = make_case_inputs(get_op(op), case)
    cu = x.pop("cu_seqlens")
    x["initial_state"] = torch.randn(len(lengths), 3, 16, 8)
    gen = torch.Generator().manual_seed(4)
    do, dht = torch.randn(1, sum(lengths), 3, 8, generator=gen), torch.randn(len(lengths), 3, 16, 8, generator=gen)

    def run(inputs: dict[str, torch.Tensor], **kw: Any) -> tuple[torch.Tensor, ...]:
        leaves = {n: t.detach().clone().requires_grad_(True) for n, t in inputs.items()}
        o, ht = impl(**leaves, chunk_size=16, **kw)
        return o, ht, *torch.autograd.grad((o, ht), list(leaves.values()), (do[:, : o.shape[1]], dht[: ht.shape[0]]))

    packed = run(x, cu_seqlens=cu)
    bounds = list(itertools.pairwise(itertools.accumulate(lengths, initial=0)))
    alone = []
    for i, (a, b) in enumerate(bounds):
        part = {n: (t[i : i + 1] if n == "initial_state" else t[:, a:b]) for n, t in x.items()}
        do_i, dht_i = do[:, a:b], dht[i : i + 1]
        leaves = {n: t.detach().clone().requires_grad_(True) for n, t in part.items()}
        o, ht = impl(**leaves, chunk_size=16)
        alone.append((o, ht, *torch.autograd.grad((o, ht), list(leaves.values()), (do_i, dht_i))))
    names = list(x)
    joined = [torch.cat([r[0] for r in alone], dim=1), torch.cat([r[1] for r in alone])]
    for j, n in enumerate(names):
        joined.append(torch.cat([r[2 + j] for r in alone], dim=0 if n == "initial_state" else 1))
    for label, got, want in zip(["o", "final_state", *names], packed, joined, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=lambda m, label=label: f"{label}: {m}")


# One long sequence among short ones: padded to the longest it would be 4 x 130 rows for 136 tokens.
SKEWED = (3, 1, 130, 2)


@pytest.mark.parametrize("op", ["gdn", "gdn2", "kda"])
def test_a_skewed_packing_runs_sequence_by_sequence_and_passes_the_gate(op: str) -> None:
    from deltabench.kernels.common import varlen

    impl = get_impl(op, "torch_chunk")
    case = Case(op, B=1, T=sum(SKEWED), H=2, K=16, V=16, seqlens=SKEWED, mode="fwd+bwd")
    report = gate(impl, case)
    assert report.passed, [(r.check, r.value, r.detail) for r in report.failures]
    # the layout's choice: every dense call holds one sequence, none padded to the longest
    calls: list[tuple[int, int]] = []

    def dense(*xs: torch.Tensor, **kw: object) -> tuple[torch.Tensor, torch.Tensor]:
        calls.append(tuple(xs[0].shape[:2]))
        return gdn_torch_recurrent(*xs, **kw)

    x = make_case_inputs(get_op("gdn"), Case("gdn", B=1, T=sum(SKEWED), H=2, K=16, V=16, seqlens=SKEWED))
    seqs = [x[name] for name in ("q", "k", "v", "g", "beta")]
    o, ht = varlen.run_packed(dense, *seqs, cu_seqlens=x["cu_seqlens"])
    assert calls == [(1, n) for n in SKEWED]
    bounds = list(itertools.pairwise(itertools.accumulate(SKEWED, initial=0)))
    alone = [gdn_torch_recurrent(*(s[:, a:b] for s in seqs)) for a, b in bounds]
    assert torch.equal(o, torch.cat([a[0] for a in alone], dim=1))
    assert torch.equal(ht, torch.cat([a[1] for a in alone]))


@pytest.mark.parametrize(
    ("name", "mode"),
    [
        ("triton_chunk", "fwd+bwd"),
        ("triton_chunk_split", "fwd+bwd"),
        ("triton_chunk_auto", "fwd+bwd"),
        ("triton_recurrent", "fwd"),
    ],
)
def test_triton_gdn_passes_the_packed_gate_under_the_interpreter(name: str, mode: str) -> None:
    report = gate(get_impl("gdn", name), packed_case(mode=mode), regimes=("strong",))
    assert report.passed, [(r.check, r.value, r.detail) for r in report.failures]


# ------------------------------------------------------------------------------------------------ planted bugs


def _offsets(cu_seqlens: torch.Tensor) -> list[int]:
    return [int(x) for x in cu_seqlens.tolist()]


def state_carried_over(q, k, v, g, beta, scale=None, initial_state=None, cu_seqlens=None):
    """The whole packed row as one sequence from the first state row: each sequence's final state is the state at
    its end, the state carried over every boundary."""
    offsets = _offsets(cu_seqlens)
    h0 = None if initial_state is None else initial_state[:1]
    outs, states, S = [], [], h0
    for bos, eos in itertools.pairwise(offsets):
        o, S = gdn_torch_recurrent(
            q[:, bos:eos], k[:, bos:eos], v[:, bos:eos], g[:, bos:eos], beta[:, bos:eos], scale, S
        )
        outs.append(o)
        states.append(S)
    return torch.cat(outs, dim=1), torch.cat(states)


def chunk_straddles(q, k, v, g, beta, scale=None, initial_state=None, cu_seqlens=None):
    """Sequences found by chunk index (offset // 64): a chunk holding a boundary runs whole as the sequence its
    first token belongs to."""
    offsets = _offsets(cu_seqlens)
    T = offsets[-1]
    snapped = [o - o % CHUNK for o in offsets[:-1]] + [T]
    outs, states = [], []
    for i, (bos, eos) in enumerate(itertools.pairwise(snapped)):
        S = None if initial_state is None else initial_state[i : i + 1]
        if eos == bos:
            states.append(S if S is not None else q.new_zeros(1, q.shape[2], q.shape[3], v.shape[3]))
            continue
        o, S = gdn_torch_recurrent(
            q[:, bos:eos], k[:, bos:eos], v[:, bos:eos], g[:, bos:eos], beta[:, bos:eos], scale, S
        )
        outs.append(o)
        states.append(S)
    return torch.cat(outs, dim=1), torch.cat(states)


def length_one_skipped(q, k, v, g, beta, scale=None, initial_state=None, cu_seqlens=None):
    """Right for every sequence but those of one token: their output left zero, their state passed through."""
    offsets = _offsets(cu_seqlens)
    outs, states = [], []
    for i, (bos, eos) in enumerate(itertools.pairwise(offsets)):
        S = None if initial_state is None else initial_state[i : i + 1]
        if eos - bos == 1:
            outs.append(torch.zeros_like(v[:, bos:eos]))
            states.append(S if S is not None else q.new_zeros(1, q.shape[2], q.shape[3], v.shape[3]))
            continue
        o, S = gdn_torch_recurrent(
            q[:, bos:eos], k[:, bos:eos], v[:, bos:eos], g[:, bos:eos], beta[:, bos:eos], scale, S
        )
        outs.append(o)
        states.append(S)
    return torch.cat(outs, dim=1), torch.cat(states)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize(
    ("bug", "failing"),
    [
        (state_carried_over, {"output", "final_state"}),
        (chunk_straddles, {"output", "final_state"}),
        (length_one_skipped, {"output", "final_state"}),
    ],
)
def test_a_boundary_bug_fails_the_gate(bug: Callable[..., object], failing: set[str], dtype: str) -> None:
    report = gate(bug, packed_case(dtype=dtype, mode="fwd+bwd"))
    assert not report.passed
    assert failing <= {r.check for r in report.failures}


def test_a_length_one_sequence_is_named_by_the_per_sequence_record() -> None:
    """Only the one-token sequence is wrong: the failing record names it (a whole-tensor norm would average its
    error over the 150 tokens)."""
    report = gate(length_one_skipped, packed_case(mode="fwd"))
    full = [r for r in report.failures if not r.reference.startswith("oracle at")]  # the sweep's are shorter
    out = [r for r in full if r.check == "output" and r.metric == "rel_fro"]
    assert out and all("sequence 2 (length 1)" in r.detail for r in out)
    assert all(r.worst_index and r.worst_index[1] == 81 for r in out)


# ------------------------------------------------------------------------------------------------ FLA's adapter


def test_the_fla_adapter_passes_cu_seqlens_to_flas_varlen_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """FLA cannot run here: a stand-in for ``fla.ops.gated_delta_rule`` with FLA's signature (our torch_chunk
    behind it) checks what the adapter passes, and the gate checks that the result is the packed one."""
    import types

    from deltabench.kernels.external import fla

    seen: list[dict] = []

    def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                               use_qk_l2norm_in_kernel=False, cu_seqlens=None):  # fmt: skip
        seen.append({"cu_seqlens": cu_seqlens, "output_final_state": output_final_state})
        chunk = get_impl("gdn", "torch_chunk")
        return chunk(q, k, v, g, beta, scale=scale, initial_state=initial_state, cu_seqlens=cu_seqlens)

    fake = types.SimpleNamespace(chunk_gated_delta_rule=chunk_gated_delta_rule)
    monkeypatch.setattr(fla, "_modules", {"gated_delta_rule": fake, "chunk_o": None})
    report = gate(fla.gdn_fla_chunk, packed_case(mode="fwd+bwd"), regimes=("long",))
    assert report.passed, [(r.check, r.value, r.detail) for r in report.failures]
    assert seen and all(s["cu_seqlens"] is not None and s["output_final_state"] for s in seen[:1])
    assert all(get_impl(op, "fla_chunk").varlen for op in ("gdn", "gdn2", "kda"))


def test_the_flash_qla_adapter_passes_cu_seqlens_to_its_varlen_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """FlashQLA cannot run here: a stand-in module with its entry point's signature (our torch_chunk behind it)
    checks that the adapter hands over the offsets, and the gate that the result is the packed one."""
    import sys
    import types

    from deltabench.kernels.external import flash_qla

    seen: list[object] = []

    def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                               use_qk_l2norm_in_kernel=False, cu_seqlens=None, head_first=False):  # fmt: skip
        seen.append(cu_seqlens)
        chunk = get_impl("gdn", "torch_chunk")
        return chunk(q, k, v, g, beta, scale=scale, initial_state=initial_state, cu_seqlens=cu_seqlens)

    monkeypatch.setitem(sys.modules, "flash_qla", types.SimpleNamespace(chunk_gated_delta_rule=chunk_gated_delta_rule))
    report = gate(flash_qla.gdn_flash_qla, packed_case(mode="fwd+bwd"), regimes=("long",))
    assert report.passed, [(r.check, r.value, r.detail) for r in report.failures]
    assert seen and seen[0] is not None
    assert get_impl("gdn", "flash_qla").varlen


@pytest.mark.parametrize("mode", ["fwd", "fwd+bwd", "bwd"])
def test_the_timed_call_gets_the_offsets(mode: str) -> None:
    """The runner times the packed call, not the dense one over the same tokens."""
    from deltabench.runners.closures import build_subject

    case = packed_case(mode=mode, initial_state=True)
    seen: list[object] = []

    def impl(*args, **kwargs):
        seen.append(kwargs.get("cu_seqlens"))
        return get_impl("gdn", "torch_chunk")(*args, **kwargs)

    build_subject(impl, case, make_case_inputs(get_op("gdn"), case))()
    assert seen and all(c is not None and c.tolist() == [0, 17, 81, 82, 150] for c in seen)


def test_a_packed_case_too_costly_for_the_oracle_gates_against_torch_chunk() -> None:
    """Against torch_chunk at the full shape, the oracle at the packing's first 256 tokens: a leak still fails."""
    case = Case("gdn", B=1, T=300, H=2, K=16, V=16, seqlens=(17, 64, 1, 218), mode="fwd+bwd")
    good = gate(get_impl("gdn", "torch_recurrent"), case, reference="torch_chunk", regimes=("long",))
    assert good.passed and "oracle at B1-T256-H2-K16-V16-N4" in good.reference
    bad = gate(state_carried_over, case, reference="torch_chunk", regimes=("long",))
    assert not bad.passed and {"output", "final_state"} <= {r.check for r in bad.failures}


def test_chunked_impls_lay_each_sequence_on_chunks_of_its_own() -> None:
    """The chunked impls' packed layout (triton_chunk's, the torch_chunk references'): sequence i starts on a chunk
    of its own; the layout names each sequence's chunks, at any chunk size."""
    from deltabench.kernels.common.varlen import chunk_layout

    offsets = torch.tensor([0, 17, 81, 82, 150], dtype=torch.int32)
    layout = chunk_layout(offsets, 150, 64)
    assert layout.NT == 5 and layout.counts == (1, 1, 1, 2)  # 17 -> 1 chunk, 64 -> 1, 1 -> 1, 68 -> 2
    assert layout.starts.dtype == torch.int32 and layout.starts.tolist() == [0, 1, 2, 3, 5]
    positions, pads = layout.positions, layout.pads
    assert positions[:18].tolist() == [*range(17), 64] and positions[81].item() == 128 and positions[-1] == 68 + 191
    assert sorted(positions.tolist() + pads.tolist()) == list(range(5 * 64)), "every row a token's or a pad"
    assert chunk_layout(torch.tensor([0, 70, 470, 599], dtype=torch.int32), 599, 64).counts == (2, 7, 3)
    assert chunk_layout(offsets, 150, 16).counts == (2, 4, 1, 5)
    # each row's source token (the moves into the row are gathers): the token at its position, 0 at the pads
    assert layout.sources[positions].tolist() == list(range(150)) and set(layout.sources[pads].tolist()) == {0}
    # the walks' launch order: longest first, ties the earlier first
    assert layout.order.dtype == torch.int32 and layout.order.tolist() == [3, 0, 1, 2]
    assert chunk_layout(torch.tensor([0, 70, 470, 599], dtype=torch.int32), 599, 64).order.tolist() == [1, 2, 0]


def test_a_layout_is_reused_only_for_the_same_unchanged_offsets() -> None:
    """The layout is made once for a cu_seqlens tensor (as a model's layers share one); an in-place change to
    that tensor, another tensor of the same values or another T makes it again."""
    from deltabench.kernels.common.varlen import chunk_layout

    offsets = torch.tensor([0, 17, 81, 82, 150], dtype=torch.int32)
    first = chunk_layout(offsets, 150, 64)
    assert chunk_layout(offsets, 150, 64) is first
    assert chunk_layout(offsets.clone(), 150, 64) is not first
    assert chunk_layout(offsets, 150, 32) is not first
    offsets[1] = 30
    again = chunk_layout(offsets, 150, 64)
    assert again is not first and again.positions[:18].tolist() == list(range(18))
    with pytest.raises(ValueError, match="rise strictly from 0 to T=160"):
        chunk_layout(offsets, 160, 64)
    with pytest.raises(ValueError, match="a batch of one row, got B=2"):
        chunk_layout(offsets, 150, 64, B=2)


def test_tokens_move_into_chunks_and_back_with_their_gradients() -> None:
    """Into the chunk-aligned row: each token at its row, zeros at the pads; out of it: the tokens again. The
    gradients move the other way (a pad's gradient dropped)."""
    from deltabench.kernels.common.varlen import chunk_layout, from_chunks, to_chunks

    layout = chunk_layout(torch.tensor([0, 17, 81, 82, 150], dtype=torch.int32), 150, 64)
    x = torch.randn(1, 150, 3, 5, dtype=torch.float64, requires_grad=True)
    row = to_chunks(x, layout)
    assert row.shape == (1, layout.NT * 64, 3, 5)
    assert torch.equal(row[0, layout.positions], x[0]) and not row[0, layout.pads].any()
    assert torch.autograd.gradcheck(lambda t: from_chunks(to_chunks(t, layout) * 2, layout), (x,))
    assert torch.autograd.gradcheck(lambda t: to_chunks(t, layout), (x,))


# Each sequence is walked by programs of its own, so the walks differ in length: a sequence many chunks longer than
# the others (7 chunks against 1 to 3), with a one-token sequence (the fused walk: the split forward takes it for a
# packing with a sequence of one chunk), and with every sequence over one chunk (the split forward's own walk).
LONG = (1, 70, 400, 129)
WALKED = (70, 400, 129)


def triton_case(seqlens: tuple[int, ...], **fields: object) -> Case:
    return Case("gdn", B=1, T=sum(seqlens), H=2, K=16, V=16, seqlens=seqlens, **fields)


@pytest.mark.parametrize(("name", "seqlens"), [("triton_chunk", LONG), ("triton_chunk_split", WALKED)])
def test_triton_gdn_passes_the_packed_gate_with_a_long_sequence(name: str, seqlens: tuple[int, ...]) -> None:
    report = gate(get_impl("gdn", name), triton_case(seqlens, mode="fwd+bwd"), regimes=("strong",))
    assert report.passed, [(r.check, r.value, r.detail) for r in report.failures]
    checks = {r.check for r in report.records}
    assert {"output", "final_state", "grad:initial_state", "grad:q", "grad:k", "grad:v", "grad:g"} <= checks


@pytest.mark.parametrize(("name", "seqlens"), [("triton_chunk", LONG), ("triton_chunk_split", WALKED)])
def test_a_packed_sequence_gets_the_bits_it_gets_alone(name: str, seqlens: tuple[int, ...]) -> None:
    """Each packed sequence's output, final state and gradients are bitwise those of the same impl on that sequence
    alone (the same arithmetic a chunk; the packed chunks zero-padded where the dense ones are masked), but dg's:
    its in-chunk sums run over the padded rows' terms in another order. Measured here (interpreter, bf16): dg within
    4.8e-7 of its largest value, float32 rounding, and the same with the packed row walked serially (before each
    sequence had programs of its own)."""
    impl = get_impl("gdn", name)
    x = make_case_inputs(get_op("gdn"), triton_case(seqlens, initial_state=True, dtype="bf16"))
    names = ("q", "k", "v", "g", "beta", "initial_state")

    def run(xs: list[torch.Tensor], **kw: object) -> list[torch.Tensor]:
        leaves = [t.detach().clone().requires_grad_(True) for t in xs]
        o, ht = impl(*leaves[:5], initial_state=leaves[5], **kw)
        (o.float().square().sum() + ht.square().sum()).backward()
        return [o, ht, *(t.grad for t in leaves)]

    packed = run([x[n] for n in names], cu_seqlens=x["cu_seqlens"])
    bounds = list(itertools.pairwise(itertools.accumulate(seqlens, initial=0)))
    for i, (bos, eos) in enumerate(bounds):
        alone = run([x[n][i : i + 1] if n == "initial_state" else x[n][:, bos:eos] for n in names])
        mine = [packed[0][:, bos:eos], packed[1][i : i + 1]]
        mine += [t[:, bos:eos] for t in packed[2:7]] + [packed[7][i : i + 1]]
        for what, a, b in zip(("o", "ht", *names), mine, alone, strict=True):
            where = f"sequence {i} (length {eos - bos}): {what}"
            if what == "g":
                assert (a - b).abs().max() <= 1e-6 * b.abs().max(), where
            else:
                assert torch.equal(a, b), where


@pytest.mark.parametrize(("seqlens", "walked"), [(WALKED, True), (SEQLENS, False)])
def test_triton_chunk_split_walks_every_packed_sequence_in_one_launch(
    seqlens: tuple[int, ...], walked: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The split forward takes the packed row whole (walk.py's VARLEN walk, a program per sequence and head, then
    the outputs), not a loop of one forward a sequence; with a sequence of one chunk, state.py's fused walk (the
    split walk's pipelined launch faulted on a walk of one chunk on the H200)."""
    from deltabench.kernels.gdn.triton import varlen, walk

    calls: dict[str, list] = {"walk": [], "fused": []}

    def counted(key: str, real: Any) -> Any:
        def fn(*args: Any, **kwargs: Any) -> Any:
            calls[key].append(kwargs.get("packed"))
            return real(*args, **kwargs)

        return fn

    monkeypatch.setattr(walk, "state_walk", counted("walk", walk.state_walk))
    monkeypatch.setattr(varlen, "state_fwd", counted("fused", varlen.state_fwd))
    x = make_case_inputs(get_op("gdn"), triton_case(seqlens, mode="fwd"))
    get_impl("gdn", "triton_chunk_split").fn(*(x[n] for n in ("q", "k", "v", "g", "beta")), cu_seqlens=x["cu_seqlens"])
    assert len(calls["walk"] + calls["fused"]) == 1 and len(calls["walk"]) == int(walked)
    assert (calls["walk"] + calls["fused"])[0].n == len(seqlens)
