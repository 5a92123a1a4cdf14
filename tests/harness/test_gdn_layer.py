"""The GatedDeltaNet mixer block (``gdn_layer``) as an op: its oracle streams exactly through the packed state, its
impls pass the gate (outputs, state and every gradient, the weights' included), and planted bugs in the block (a
conv that looks ahead, a conv history not carried, the norm gate missing) each fail it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from deltabench.cli.app import main
from deltabench.correctness.engine import verify_case
from deltabench.harness import registry
from deltabench.harness.cases import Case
from deltabench.harness.document import ResultDocument
from deltabench.harness.ops import OPS
from deltabench.kernels.gdn_layer import torch_layer
from deltabench.references import gdn_layer as L

_CAUSAL_CONV = L.causal_conv  # the real conv, for the planted bugs built on it
DIMS = {"B": 1, "T": 40, "D": 8, "H": 2, "K": 4, "V": 4}

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _gate(fn: Any, *, mode: str = "fwd+bwd", regimes: list[str] | None = None, **dims: int):  # type: ignore[no-untyped-def]
    case = Case("gdn_layer", **{**DIMS, **dims}, dtype="fp32", mode=mode)
    return verify_case(fn, case, seeds=1, extra_seed=False, regimes=regimes)


def _failed(report) -> set[str]:  # type: ignore[no-untyped-def]
    return {r.check for r in report.failures}


def test_the_op_is_built_in_with_its_impls() -> None:
    assert OPS["gdn_layer"] is L.CONTRACT
    names = {i.name for i in registry.impls_for("gdn_layer")}
    gdn = {"torch_recurrent", "triton_chunk", "triton_chunk_split", "triton_chunk_auto"}
    assert names == {"torch_layer", *(f"layer:{n}" for n in gdn)}
    triton = registry.get_impl("gdn_layer", "layer:triton_chunk")
    assert triton.constraint is registry.get_impl("gdn", "triton_chunk").constraint and not triton.varlen
    dims = {**DIMS, "T": 3}
    assert L.CONTRACT.state.shape(dims) == (1, 3 * (2 * 2 * 4 + 2 * 4) + 2 * 4 * 4)
    assert L.CONTRACT.arg("conv_v").shape(dims) == (1, 4, 2, 4)


@pytest.mark.parametrize("t1", [1, 2, 3, 17])
def test_the_oracle_streams_exactly_through_the_packed_state(t1: int) -> None:
    """T1 tokens then the rest from the returned state equal all T at once to float64's last bits (a split inside
    the conv's window, T1 < 3, included): the projections' GEMMs at T1 and T - T1 rows may round differently from
    one at T (MKL on an AVX-512 host: 1 ulp of y), a state carried wrongly is off by its whole size."""
    inputs = L.make_inputs(**{**DIMS, "B": 2, "T": 23}, dtype=torch.float64, seed=3, initial_state=True)
    x, weights = inputs["x"], [inputs[n] for n in L.WEIGHTS]
    y, state = L.gdn_layer_oracle(x, *weights, initial_state=inputs["initial_state"])
    y1, s1 = L.gdn_layer_oracle(x[:, :t1], *weights, initial_state=inputs["initial_state"])
    y2, s2 = L.gdn_layer_oracle(x[:, t1:], *weights, initial_state=s1)
    torch.testing.assert_close(torch.cat([y1, y2], dim=1), y, rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(s2, state, rtol=1e-14, atol=1e-14)


def test_the_conv_history_is_the_last_three_projections() -> None:
    inputs = L.make_inputs(**DIMS, dtype=torch.float64)
    _, state = L.gdn_layer_oracle(inputs["x"], *(inputs[n] for n in L.WEIGHTS))
    history, _ = L.unpack_state(state, 2, 4, 4)
    x = inputs["x"][:, -3:]
    q = torch.einsum("btd,bdhk->bthk", x, inputs["w_q"]).flatten(2)
    assert torch.allclose(history[..., :8], q)


@pytest.mark.parametrize("impl", ["torch_layer", "layer:torch_recurrent"])
def test_torch_impls_pass_the_gate_with_every_gradient(impl: str) -> None:
    report = _gate(registry.get_impl("gdn_layer", impl))
    assert report.passed, [f"{r.check} {r.regime} {r.detail}" for r in report.failures]
    grads = {r.check for r in report.records if r.check.startswith("grad:")}
    assert grads == {f"grad:{n}" for n in L.CONTRACT.grad_inputs}
    assert {r.regime for r in report.records if r.check == "output"} == set(L.CONTRACT.regimes)


def _lookahead_conv(pre: torch.Tensor, weight: torch.Tensor, history: torch.Tensor) -> Any:
    """Each tap one token later: the last tap reads the next token (zero after the last)."""
    T = pre.shape[1]
    full = torch.cat([history, pre, pre.new_zeros(pre.shape[0], 1, pre.shape[2])], dim=1)
    out = sum(weight[:, j, None, :] * full[:, j + 1 : j + 1 + T] for j in range(L.CONV))
    return out, full[:, T : T + L.CONV - 1]


def _forgetful_conv(pre: torch.Tensor, weight: torch.Tensor, history: torch.Tensor) -> Any:
    """The conv right within the call, but the history it returns is zeros: the state does not carry it."""
    out, new = _CAUSAL_CONV(pre, weight, history)
    return out, torch.zeros_like(new)


def _ungated_norm(o: torch.Tensor, norm_w: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """The RMSNorm without the SiLU gate."""
    return o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + 1e-6) * norm_w[:, None, None]


@pytest.mark.parametrize(
    "name, fn, expected",
    [
        ("causal_conv", _lookahead_conv, {"output"}),
        ("causal_conv", _forgetful_conv, {"streaming:output", "final_state"}),
        ("gated_norm", _ungated_norm, {"output"}),
    ],
    ids=["conv-looks-ahead", "conv-history-dropped", "norm-gate-missing"],
)
def test_planted_block_bugs_fail_the_gate(
    name: str, fn: Callable[..., Any], expected: set[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug planted in the impls' block for the whole gate, the oracle's run included: the oracle shares no code
    with the block, so the bug shows."""
    monkeypatch.setattr(L, name, fn)
    report = _gate(torch_layer, mode="fwd", regimes=["typical"])
    assert not report.passed
    assert expected <= _failed(report), _failed(report)


_PLANTED = """
import torch
from deltabench.references import gdn_layer

def gated_norm(o, norm_w, gate):
    return o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + 1e-6) * norm_w[:, None, None] * gate

gdn_layer.gated_norm = gated_norm
"""


def test_verify_fails_the_block_with_a_planted_bug(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``deltabench verify --op gdn_layer`` on the CPU, in its child process: the built-in ``torch_layer`` with the
    output gate's sigmoid dropped from the block (an --import file that plants it) exits 1 on the output."""
    planted = tmp_path / "planted.py"
    planted.write_text(_PLANTED)
    args = ["verify", "--op", "gdn_layer", "--impl", "torch_layer", "--shape", "B=1,T=12,D=8,H=2,K=4", "--dtype",
            "fp32", "--device", "cpu", "--seeds", "1", "--regime", "typical", "--mode", "fwd", "--json"]  # fmt: skip
    with pytest.raises(SystemExit) as exit_info:
        main([*args, "--import", str(planted)])
    assert exit_info.value.code == 1
    failed = {r["check"] for r in json.loads(capsys.readouterr().out)["records"] if r["gating"] and not r["passed"]}
    assert "output" in failed, failed


def test_the_layer_over_triton_chunk_passes_the_gate() -> None:
    """``layer:triton_chunk``: the block around gdn's Triton chunked kernels (the interpreter on this CPU)."""
    pytest.importorskip("triton")
    report = _gate(registry.get_impl("gdn_layer", "layer:triton_chunk"), regimes=["typical"])
    assert report.passed, [f"{r.check} {r.regime} {r.detail}" for r in report.failures]
    assert "grad:w_o" in {r.check for r in report.records}


def test_the_layer_cpu_suite_runs_end_to_end(tmp_path: Path) -> None:
    """``deltabench run --suite layer-cpu``: both impls, fwd and fwd+bwd, every job ok with every gating check."""
    out = tmp_path / "layer.json"
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--suite", "layer-cpu", "--device", "cpu", "--out", str(out), "--no-db", "--quiet"])
    assert not exit_info.value.code
    doc = ResultDocument.from_json(out.read_text())
    assert {(j.impl, j.case.mode) for j in doc.jobs} == {
        (i, m) for i in ("torch_layer", "layer:triton_chunk") for m in ("fwd", "fwd+bwd")
    }
    for job in doc.jobs:
        assert job.status == "ok", (job.impl, job.status, job.reason)
        assert all(r.passed for r in job.verification if r.gating), job.impl
        assert any(r.check == "grad:w_gate" for r in job.verification) == (job.case.mode == "fwd+bwd")
