"""Devices are real: a case's device is where it runs, or the job ends `unsupported` saying why.

On a machine without a TPU, a job from a ``tpu-v5e`` queue (through the worker's device mapping) and
``deltabench run --device tpu`` end every job ``unsupported`` (``no TPU visible to JAX`` for JAX impls; the
devices they run on for torch ones) instead of gating and timing them on the host CPU. A JAX impl asked for
``cpu`` computes on JAX's CPU device; the CUDA branch runs where JAX sees a GPU.
"""

from __future__ import annotations

import pytest
import torch

from deltabench.cli.app import main
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
    from deltabench.fleet.worker import QueuedJobRequest, device_for_kind, run_queued_job

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
    from deltabench.kernels.common.jax.jax_bridge import placed_on

    with pytest.raises(RuntimeError), placed_on("tpu"):
        pass


def _jax_output_platforms(device: str) -> set[str]:
    """The platforms of the output of the JAX impl jax_chunk called the way the gate calls it (torch in)."""
    impl = get_impl("gdn", "jax_chunk")
    inputs = get_op("gdn").make_inputs(
        1, 12, 1, 8, 8, dtype=torch.float32, device=parse_device(device).torch_device, seed=0, regime="typical"
    )
    from deltabench.kernels.common.jax.jax_bridge import torch_to_jax
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


def test_a_job_places_its_jax_impl_on_the_cases_device_for_the_gate() -> None:
    """Through runners.job.execute: the torch-facing call of the gate crosses over to the case's JAX device."""
    from deltabench.harness.cases import Case
    from deltabench.harness.registry import register_impl
    from deltabench.kernels.common.jax.jax_bridge import torch_to_jax
    from deltabench.runners.base import JobSpec
    from deltabench.runners.job import execute

    seen: set[str] = set()
    chunk = get_impl("gdn", "torch_chunk")

    @register_impl("gdn", "spy_jax_placement", backend="jax", devices=("cpu", "cuda", "tpu"), dtypes=("fp32",))
    def spy(q, k, v, g, beta, scale=None, initial_state=None):
        seen.update(d.platform for d in torch_to_jax(q).devices())
        return chunk(q, k, v, g, beta, scale=scale, initial_state=initial_state)

    case = Case("gdn", 1, 12, 1, 8, 8, dtype="fp32", mode="fwd", device="cpu")
    job = JobSpec.for_case(case, "spy_jax_placement", gate={"seeds": 1, "extra_seed": False},
                           timing={"budget_s": 0.02, "min_reps": 2, "warmup_s": 0.0})  # fmt: skip
    result = execute(job)
    assert result.status == "ok", result.reason
    assert seen == {"cpu"}


def test_host_tensors_cross_over_to_the_placed_device_not_the_default() -> None:
    """The TPU path on a machine without one: host tensors committed to the placed device (here the second of
    two XLA host devices, in a fresh process that asks XLA for two), and jitted code computes there."""
    import os
    import subprocess
    import sys

    code = (
        "import jax, torch\n"
        "from deltabench.kernels.common.jax.jax_bridge import placed_on, torch_to_jax\n"
        "t = torch.arange(6, dtype=torch.float32)\n"
        "assert torch_to_jax(t).devices() == {jax.devices('cpu')[0]}\n"
        "with placed_on('cpu', 1) as dev:\n"
        "    x = torch_to_jax(t)\n"
        "    y = jax.jit(lambda a: a * 2)(x)\n"
        "assert dev == jax.devices('cpu')[1], dev\n"
        "assert x.devices() == {dev} and y.devices() == {dev}, (x.devices(), y.devices())\n"
        "assert torch_to_jax(t).devices() == {jax.devices('cpu')[0]}\n"
    )
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2", "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
