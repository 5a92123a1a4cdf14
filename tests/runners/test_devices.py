"""Devices are real: a case's device is where it runs, or the job ends `unsupported` saying why.

On a machine without a TPU, a job from a ``tpu-v5e`` queue (through the worker's device mapping) and
``deltabench run --device tpu`` end every job ``unsupported`` (``no TPU visible to JAX`` for JAX impls; the
devices they run on for torch ones) instead of gating and timing them on the host CPU. A JAX impl asked for
``cpu`` computes on JAX's CPU device; the CUDA branch runs where JAX sees a GPU.
"""

from __future__ import annotations

import pytest
import torch
from deltabench.harness.cli import main
from deltabench.harness.devices import (
    Device,
    absent_reason,
    device_for_kind,
    parse_device,
    parse_platform,
    placement,
)
from deltabench.harness.document import ResultDocument
from deltabench.harness.errors import BadInput
from deltabench.harness.ops import get_op
from deltabench.harness.registry import get_impl
from deltabench.runners.environment import tpu_machine_kind

jax = pytest.importorskip("jax")

TINY = "B=1,T=12,H=1,K=8,V=8"
NO_TPU = "no TPU visible to JAX"
HAS_TPU = absent_reason("tpu") is None
needs_no_tpu = pytest.mark.skipif(HAS_TPU, reason="this machine has a TPU: the absent-TPU path cannot be shown")


def _has_jax_gpu() -> bool:
    try:
        return bool(jax.devices("gpu"))
    except RuntimeError:
        return False


@pytest.mark.parametrize(
    ("text", "device"),
    [("cpu", Device("cpu")), ("CUDA", Device("cuda")), ("cuda:1", Device("cuda", 1)), ("gpu", Device("cuda")),
     ("tpu", Device("tpu")), ("tpu:3", Device("tpu", 3))],
)  # fmt: skip
def test_devices_parse_in_one_place(text: str, device: Device) -> None:
    assert parse_device(text) == device
    assert parse_device(str(device)) == device


@pytest.mark.parametrize("text", ["npu", "cuda:", "cuda:x", "", "tpu:-1"])
def test_unknown_devices_are_bad_input(text: str) -> None:
    with pytest.raises(BadInput, match="unknown device"):
        parse_device(text)
    with pytest.raises(BadInput, match="give a platform"):
        parse_platform("cuda:0")


def test_torch_keeps_a_tpu_cases_tensors_on_the_host() -> None:
    assert Device("tpu").torch_device == "cpu" and Device("cuda", 1).torch_device == "cuda:1"
    assert device_for_kind("tpu-v5e") == Device("tpu") and device_for_kind("h200") == Device("cuda")


@pytest.mark.parametrize(
    ("device_kind", "kind"),
    [("TPU v5 lite", "tpu-v5e"), ("TPU v5e", "tpu-v5e"), ("TPU v6 lite", "tpu-v6e"), ("TPU v5", "tpu-v5p"),
     ("TPU v5p", "tpu-v5p"), ("TPU v4", "tpu-v4")],
)  # fmt: skip
def test_a_tpu_names_its_machine_kind(device_kind: str, kind: str) -> None:
    assert tpu_machine_kind(device_kind) == kind


@needs_no_tpu
def test_a_tpu_v5e_queue_job_ends_unsupported_here(tmp_path) -> None:
    from deltabench.runners.worker import QueuedJobRequest, device_for_kind, run_queued_job

    spec = {"ops": ["gdn"], "impls": ["jax_chunk", "torch_chunk"], "shapes": [TINY], "dtypes": ["fp32"],
            "modes": ["fwd"], "device_kind": "tpu-v5e"}  # fmt: skip
    device = device_for_kind(spec["device_kind"])
    assert device == "tpu"
    doc = run_queued_job(
        QueuedJobRequest(queue_job_id=1, run_id="job1-tpu", spec=spec, device=device, out=str(tmp_path / "d.json"))
    )
    reasons = {j.impl: (j.status, j.reason, j.device) for j in doc.jobs}
    assert reasons == {
        "jax_chunk": ("unsupported", NO_TPU, "tpu"),
        "torch_chunk": ("unsupported", "runs on cpu, cuda, not tpu", "tpu"),
    }
    assert all(j.timing is None and not j.verification for j in doc.jobs), "nothing ran on the host instead"
    assert doc.meta["device_kind"] == "tpu-v5e"


@needs_no_tpu
def test_run_device_tpu_says_per_job_that_there_is_no_tpu(tmp_path, capsys) -> None:
    suite = tmp_path / "tiny.toml"
    suite.write_text(
        f'name = "tiny"\nshapes = ["{TINY}"]\ndtypes = ["fp32"]\nmodes = ["fwd"]\n'
        '[ops.gdn]\nimpls = ["torch_chunk", "jax_chunk"]\nbaseline = "torch_chunk"\n'
    )
    out = tmp_path / "run.json"
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--suite", str(suite), "--device", "tpu", "--no-db", "--out", str(out), "--format", "json"])
    assert exit_info.value.code == 0  # as for any unsupported job: nothing failed
    doc = ResultDocument.from_json(out.read_text())
    assert [(j.impl, j.status, j.reason) for j in doc.jobs] == [
        ("torch_chunk", "unsupported", "runs on cpu, cuda, not tpu"),
        ("jax_chunk", "unsupported", NO_TPU),
    ]
    assert doc.meta["device"] == "tpu" and doc.environment.machine_kind != "tpu-v5e"
    assert "2 unsupported" in capsys.readouterr().err


@needs_no_tpu
def test_placing_on_an_absent_tpu_raises_rather_than_falling_back() -> None:
    from deltabench.kernels.common.jax_bridge import placed_on

    with pytest.raises(RuntimeError), placed_on("tpu"):
        pass


def _jax_output_platforms(device: str) -> set[str]:
    """The platforms of the output of the JAX impl jax_chunk called the way the gate calls it (torch in)."""
    impl = get_impl("gdn", "jax_chunk")
    inputs = get_op("gdn").make_inputs(
        1, 12, 1, 8, 8, dtype=torch.float32, device=parse_device(device).torch_device, seed=0, regime="typical"
    )
    from deltabench.kernels.common.jax_bridge import torch_to_jax
    from deltabench.runners.jax import jax_ops_of

    ops = jax_ops_of(impl)
    with placement(device, impl.backend):
        args = [torch_to_jax(inputs[n]) for n in get_op("gdn").args]
        o, state = ops.jax_fn(*args)
        torch_o, _ = impl(*(inputs[n] for n in get_op("gdn").args))  # the torch-facing call, as the gate makes it
    assert torch_o.device.type == parse_device(device).torch_device.split(":")[0]
    return {d.platform for d in o.devices()} | {d.platform for d in state.devices()}


def test_a_jax_impl_asked_for_cpu_computes_on_the_cpu() -> None:
    assert _jax_output_platforms("cpu") == {"cpu"}


@pytest.mark.skipif(not _has_jax_gpu() or not torch.cuda.is_available(), reason="no GPU visible to JAX and torch")
def test_a_jax_impl_asked_for_cuda_computes_on_the_gpu() -> None:
    assert _jax_output_platforms("cuda") == {"gpu"}
