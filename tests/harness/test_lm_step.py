"""A small LM's training step (``lm_step``) as an op: its oracle streams exactly through the layers' packed states,
its impls pass the gate (the per-token loss and every parameter's gradient against the float64 model, the loss
falling on a memorisation task), a planted bug in the mixer or in the optimizer step fails it, a timed job times
the whole step (the optimizer's included), and the e2e-cpu suite runs end to end."""

from __future__ import annotations

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
from deltabench.harness.ops import OPS, get_op, make_case_inputs
from deltabench.harness.report import render_results
from deltabench.kernels.gdn.torch.torch_chunk import gdn_torch_chunk
from deltabench.kernels.lm_step import in_dtype
from deltabench.references import gdn_layer
from deltabench.references import lm_step as R
from deltabench.runners.closures import build_subject

DIMS = {"B": 1, "T": 24, "H": 2, "K": 4, "V": 4, "D": 8, "L": 2, "VOCAB": 16}

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _gate(fn: Any, *, dtype: str = "fp32", mode: str = "fwd+bwd", regimes: list[str] | None = None):  # type: ignore[no-untyped-def]
    case = Case("lm_step", **DIMS, dtype=dtype, mode=mode)
    return verify_case(fn, case, seeds=1, extra_seed=False, regimes=regimes or ["typical"])


def _failed(report) -> set[str]:  # type: ignore[no-untyped-def]
    return {r.check for r in report.failures}


def _model_over(mixer: Callable[..., Any]) -> Callable[..., Any]:
    """An impl of lm_step with `mixer` as every block's recurrence (as the built-in impls are made)."""

    def fn(tokens: Any, targets: Any, *params: Any, mixer_dtype: str = "fp32", initial_state: Any = None) -> Any:
        mix = in_dtype(mixer, R.MIXER_DTYPES[mixer_dtype])
        return R.lm_forward(mix, torch.float32, tokens, targets, *params, initial_state=initial_state)

    return fn


def test_the_op_is_built_in_with_an_impl_per_mixer() -> None:
    assert OPS["lm_step"] is R.CONTRACT
    names = {i.name for i in registry.impls_for("lm_step")}
    assert {"gdn:torch_chunk", "gdn:triton_chunk", "gdn:triton_chunk_auto", "gdn:fla_chunk"} <= names
    assert {"kda:torch_chunk", "gdn2:torch_chunk", "kda:fla_chunk"} <= names
    fla = registry.get_impl("lm_step", "gdn:fla_chunk")
    assert fla.constraint is registry.get_impl("gdn", "fla_chunk").constraint
    assert R.CONTRACT.state.shape(DIMS) == (1, DIMS["L"] * gdn_layer.state_width(DIMS))
    assert R.CONTRACT.arg("w_down").shape(DIMS) == (1, 2, 4 * 8, 8)


@pytest.mark.parametrize("t1", [1, 2, 11])
def test_the_oracle_streams_exactly_through_the_layers_states(t1: int) -> None:
    """T1 tokens then the rest from the returned state give the same losses and state as all T at once, in float64
    (a split inside the conv's window included)."""
    inputs = R.make_inputs(**{**DIMS, "B": 2}, dtype=torch.float64, seed=3, initial_state=True)
    tok, tgt, params = inputs["tokens"], inputs["targets"], [inputs[n] for n in R.PARAMS]
    loss, state = R.lm_oracle(tok, tgt, *params, initial_state=inputs["initial_state"])
    l1, s1 = R.lm_oracle(tok[:, :t1], tgt[:, :t1], *params, initial_state=inputs["initial_state"])
    l2, s2 = R.lm_oracle(tok[:, t1:], tgt[:, t1:], *params, initial_state=s1)
    # float64 to its last bits: a matmul's summation order may differ with T
    torch.testing.assert_close(torch.cat([l1, l2], dim=1), loss, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(s2, state, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_the_model_over_torch_chunk_passes_the_gate(dtype: str) -> None:
    """Every parameter's gradient is compared by name, and the loss falls on the memorisation task."""
    report = _gate(registry.get_impl("lm_step", "gdn:torch_chunk"), dtype=dtype)
    assert report.passed, [f"{r.check} {r.value} {r.detail}" for r in report.failures]
    checks = {r.check for r in report.records}
    assert {f"grad:{n}" for n in R.PARAMS} <= checks and "loss falls" in checks


def test_bf16_gradients_are_held_to_twice_the_mixers_bound_in_each_regime() -> None:
    from deltabench.correctness.tolerances import threshold

    for regime in ("typical", "long", "strong"):
        mixer = threshold("bf16", "grad:q", regime=regime, op="gdn", dims={})
        assert threshold("bf16", "grad:w_a", regime=regime, op="lm_step", dims=DIMS) == 2 * mixer
    assert threshold("bf16", "output", regime="typical", op="lm_step", dims=DIMS) == 1e-2  # the loss as gdn's o
    assert threshold("fp32", "grad:w_a", regime="typical", op="lm_step", dims=DIMS) == 1e-4


@pytest.mark.parametrize("impl", ["kda:torch_chunk", "gdn2:torch_chunk"])
def test_a_kda_or_gdn2_mixer_passes_the_gate(impl: str) -> None:
    """Their gates broadcast over the channels (kda's g; gdn2's g, b and w), the model is gdn's and passes."""
    report = _gate(registry.get_impl("lm_step", impl))
    assert report.passed, [f"{r.check} {r.value} {r.detail}" for r in report.failures]


def _no_decay(q: Any, k: Any, v: Any, g: Any, beta: Any, **kw: Any) -> Any:
    return gdn_torch_chunk(q, k, v, torch.zeros_like(g), beta, **kw)


def _stale_state(q: Any, k: Any, v: Any, g: Any, beta: Any, initial_state: Any = None, **kw: Any) -> Any:
    return gdn_torch_chunk(q, k, v, g, beta, initial_state=None, **kw)


@pytest.mark.parametrize(
    "mixer, expected",
    [
        (_no_decay, {"output", "grad:embed", "grad:a_log"}),
        (_stale_state, {"output", "grad:initial_state", "boundary:output"}),
    ],
    ids=["decay-dropped", "initial-state-ignored"],
)
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_a_planted_mixer_bug_fails_the_gate(mixer: Callable[..., Any], expected: set[str], dtype: str) -> None:
    """At bf16 too, under lm_step's own gradient bound (twice gdn's: the weights sum the mixer's error)."""
    report = _gate(_model_over(mixer), dtype=dtype)
    assert not report.passed
    assert expected <= _failed(report), _failed(report)


def _ascending(fn: Any, args: list[Any], optimizer: Any, **kwargs: Any) -> Any:
    optimizer.zero_grad(set_to_none=True)
    loss = fn(*args, **kwargs)[0].float().mean()
    (-loss).backward()  # the sign flipped: the step climbs the loss
    optimizer.step()
    return loss.detach()


def _update_dropped(fn: Any, args: list[Any], optimizer: Any, **kwargs: Any) -> Any:
    optimizer.zero_grad(set_to_none=True)
    loss = fn(*args, **kwargs)[0].float().mean()
    loss.backward()
    optimizer.zero_grad(set_to_none=True)  # the gradients cleared before the update: it never moves
    optimizer.step()
    return loss.detach()


def _lr_zero(params: list[Any], lr: float = R.LR) -> Any:
    return torch.optim.AdamW(params, lr=0.0)


@pytest.mark.parametrize(
    "name, planted",
    [("train_step", _ascending), ("train_step", _update_dropped), ("make_optimizer", _lr_zero)],
    ids=["step-ascends", "update-dropped", "learning-rate-zero"],
)
def test_a_planted_optimizer_bug_fails_the_gate(monkeypatch: pytest.MonkeyPatch, name: str, planted: Any) -> None:
    """The oracle comparison cannot see the optimizer step; ``loss falls`` fails, and only it."""
    monkeypatch.setattr(R, name, planted)
    report = _gate(registry.get_impl("lm_step", "gdn:torch_chunk"))
    assert _failed(report) == {"loss falls"}, _failed(report)


def test_the_timed_step_trains_the_parameters() -> None:
    """A fwd+bwd job's subject is a whole training step: each call moves the parameters and lowers the loss."""
    case = Case("lm_step", **DIMS, dtype="fp32", mode="fwd+bwd")
    impl = registry.get_impl("lm_step", "gdn:torch_chunk")
    subject = build_subject(impl, case, make_case_inputs(get_op("lm_step"), case))
    before = subject.held["unembed"].detach().clone()
    losses = [float(subject()) for _ in range(5)]
    assert not torch.equal(before, subject.held["unembed"]) and losses[-1] < losses[0]


def test_the_mixer_share_times_the_step_without_changing_it() -> None:
    """The instrumented step (every mixer call wrapped to read the clock) computes the step's very losses and
    gradients, and its record gives the mixer a share of the step."""
    from deltabench.runners.step_share import mixer_share_record, timing_mixers

    case = Case("lm_step", **DIMS, dtype="fp32", mode="fwd+bwd")
    impl = registry.get_impl("lm_step", "gdn:torch_chunk")
    inputs = make_case_inputs(get_op("lm_step"), case)
    args = [inputs["tokens"], inputs["targets"]]

    def loss_and_grads() -> list[torch.Tensor]:
        params = [inputs[n].detach().clone().requires_grad_(True) for n in R.PARAMS]
        loss = impl(*args, *params, mixer_dtype="fp32")[0].mean()
        return [loss.detach(), *torch.autograd.grad(loss, params)]

    plain = loss_and_grads()
    with timing_mixers(case) as clock:
        assert all(torch.equal(a, b) for a, b in zip(loss_and_grads(), plain, strict=True))
    assert {"mixer fwd", "mixer bwd"} <= set(clock.totals_ms())
    record = mixer_share_record(build_subject(impl, case, inputs), case, steps=2)
    assert 0 < record.value < 100 and "mixer fwd" in record.detail and not record.gating


def test_the_e2e_cpu_suite_runs_end_to_end(tmp_path: Path) -> None:
    """``deltabench run --suite e2e-cpu``: every job ok, gated, with tokens/s, peak memory and the mixer's share."""
    out = tmp_path / "e2e.json"
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--suite", "e2e-cpu", "--device", "cpu", "--out", str(out), "--no-db", "--quiet"])
    assert not exit_info.value.code
    doc = ResultDocument.from_json(out.read_text())
    assert {j.impl for j in doc.jobs} == {"gdn:torch_chunk", "kda:torch_chunk"}
    for job in doc.jobs:
        assert job.status == "ok", (job.impl, job.status, job.reason)
        by = {r.check: r for r in job.verification}
        assert by["loss falls"].passed and by["loss falls"].gating
        assert 0 < by["mixer share"].value < 100 and not by["mixer share"].gating
        assert job.work.tokens_per_s and job.memory.peak_bytes > 0
    table = render_results(doc, "markdown")
    assert "| tokens/s | mixer % of step | status |" in table


@pytest.mark.parametrize(
    "op, impl, dims",
    [
        ("lm_step", "gdn:torch_recurrent", DIMS),
        ("gdn_layer", "torch_layer", {"B": 1, "T": 40, "D": 8, "H": 2, "K": 4, "V": 4}),
    ],
)
def test_the_full_shape_reference_is_the_contracts_reference_impl(op: str, impl: str, dims: dict[str, int]) -> None:
    """Where the oracle stands back (``reference="torch_chunk"``), an op's full shape is compared with its contract's
    ``reference_impl`` in fp32 (``gdn:torch_chunk``, ``torch_layer``): ops without a ``torch_chunk`` impl gate there."""
    case = Case(op, **dims, dtype="fp32", mode="fwd+bwd")
    report = verify_case(
        registry.get_impl(op, impl), case, seeds=1, extra_seed=False, regimes=["typical"], reference="torch_chunk"
    )
    assert report.passed, [f"{r.check} {r.value} {r.detail}" for r in report.failures]
    assert any(r.reference == "torch_chunk_fp32" and r.check == "grad:w_o" for r in report.records)
