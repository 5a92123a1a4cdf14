"""The gate's cross-process determinism check (``determinism:process``, correctness/fresh_process.py): the determinism
call replayed in a fresh interpreter, bitwise against the first. sdm's torch_chunk passes it on the CPU through the
Python API and through ``deltabench verify``; an impl deterministic within a process but not across two fails it
(the in-process check cannot see that), and so does one that raises only in the new process."""

from __future__ import annotations

import json
import os
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from deltabench.cli.app import main
from deltabench.correctness.engine import verify_case
from deltabench.harness import registry
from deltabench.harness.cases import Case
from deltabench.kernels.sdm import sdm_torch_chunk

SHAPE = {"B": 1, "T": 40, "H": 2, "S": 16, "D": 4, "W": 3, "R": 3}

# An sdm impl whose bits depend on the process: the process that imports it first computes torch_chunk's result
# exactly; every process started from it (it leaves a mark in the environment, which children inherit) nudges one
# element of y by a few ulps (far inside every tolerance).
_PROCESS_DEPENDENT = """
import os
from deltabench.harness.registry import register_impl
from deltabench.kernels.sdm import sdm_torch_chunk

_CHILD = os.environ.get("DELTABENCH_TEST_MARK") == "set"
os.environ["DELTABENCH_TEST_MARK"] = "set"


@register_impl("sdm", "{name}", backend="torch", devices=("cpu",), dtypes=("fp32",))
def impl(*args, **kwargs):
    if {raise_in_child} and _CHILD:
        raise {error}("only in a child")
    y, bank = sdm_torch_chunk(*args, **kwargs)
    if _CHILD:
        bump = y.new_zeros(y.numel())
        bump[0] = 4e-7 * float(y.reshape(-1)[0].abs())
        y = y + bump.view(y.shape)
    return y, bank
"""


@pytest.fixture(autouse=True)
def _no_test_mark(one_torch_thread: None) -> Iterator[None]:
    os.environ.pop("DELTABENCH_TEST_MARK", None)
    yield
    os.environ.pop("DELTABENCH_TEST_MARK", None)  # the user impls' mark


def _gate(impl, **kwargs):  # type: ignore[no-untyped-def]
    case = Case("sdm", **SHAPE, dtype="fp32", mode="fwd+bwd")
    return verify_case(impl, case, seeds=1, extra_seed=False, regimes=["typical"], **kwargs)


def _records(report, check: str):  # type: ignore[no-untyped-def]
    return [r for r in report.records if r.check == check]


def _user_impl(tmp_path: Path, name: str, *, raise_in_child: bool, error: str = "RuntimeError") -> Path:
    path = tmp_path / f"{name}.py"
    text = _PROCESS_DEPENDENT.format(name=name, raise_in_child=raise_in_child, error=error)
    path.write_text("import torch\n" + textwrap.dedent(text))
    registry.load_module(str(path))
    return path


def test_torch_chunk_gives_the_same_bits_in_a_fresh_process() -> None:
    report = _gate(registry.get_impl("sdm", "torch_chunk"), fresh_process=True)
    assert report.passed, [f"{r.check} {r.detail}" for r in report.failures]
    (rec,) = _records(report, "determinism:process")
    assert rec.gating and rec.passed and rec.value == 0.0 and rec.detail == "bitwise identical"
    assert rec.reference == "same impl, same call in a fresh process"


def test_off_unless_asked_and_a_note_for_a_plain_callable() -> None:
    assert not _records(_gate(registry.get_impl("sdm", "torch_chunk")), "determinism:process")
    (rec,) = _records(_gate(sdm_torch_chunk, fresh_process=True), "determinism:process")
    assert rec.passed and not rec.gating and "not a registered impl" in rec.detail


def test_bits_that_change_across_processes_fail_only_the_fresh_process_check(tmp_path: Path) -> None:
    path = _user_impl(tmp_path, "process_dependent", raise_in_child=False)
    try:
        report = _gate(registry.get_impl("sdm", "process_dependent"), fresh_process=True, imports=[str(path)])
    finally:
        registry._REGISTRY.pop(("sdm", "process_dependent"), None)
    assert {r.check for r in report.failures} == {"determinism:process"}
    (same,) = _records(report, "determinism")
    assert same.passed
    (rec,) = _records(report, "determinism:process")
    assert rec.gating and rec.value > 0 and rec.detail == "differs in o"


def test_an_impl_that_raises_in_the_fresh_process_fails_the_check(tmp_path: Path) -> None:
    path = _user_impl(tmp_path, "raises_in_child", raise_in_child=True)
    try:
        report = _gate(registry.get_impl("sdm", "raises_in_child"), fresh_process=True, imports=[str(path)])
    finally:
        registry._REGISTRY.pop(("sdm", "raises_in_child"), None)
    (rec,) = report.failures
    assert rec.check == "determinism:process" and rec.gating
    assert rec.detail == "the impl raised in the fresh process: RuntimeError: only in a child"


def test_out_of_memory_in_the_fresh_process_is_out_of_memory_not_a_verdict(tmp_path: Path) -> None:
    # gates side by side on one GPU (--gate-workers) can leave the replay no memory: the job must end oom, not
    # incorrect
    path = _user_impl(tmp_path, "oom_in_child", raise_in_child=True, error="torch.OutOfMemoryError")
    try:
        with pytest.raises(torch.OutOfMemoryError, match="fresh-process replay: OutOfMemoryError: only in a child"):
            _gate(registry.get_impl("sdm", "oom_in_child"), fresh_process=True, imports=[str(path)])
    finally:
        registry._REGISTRY.pop(("sdm", "oom_in_child"), None)


def test_a_fresh_process_that_dies_out_of_memory_before_the_call_is_out_of_memory(tmp_path: Path) -> None:
    # On the H200 the replay died loading the saved inputs onto a device the gate's process had filled (exit code
    # 1, torch's OutOfMemoryError in its log): that is out of memory, not a determinism verdict. Here the child
    # dies the same way while importing the user's module, before any call.
    path = _user_impl(tmp_path, "dies_oom", raise_in_child=False)
    path.write_text(
        path.read_text()
        + "\nif _CHILD:\n    raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 512.00 MiB')\n"
    )
    try:
        with pytest.raises(torch.OutOfMemoryError, match=r"fresh-process replay: .*Tried to allocate 512\.00 MiB"):
            _gate(registry.get_impl("sdm", "dies_oom"), fresh_process=True, imports=[str(path)])
    finally:
        registry._REGISTRY.pop(("sdm", "dies_oom"), None)


def test_one_rule_tells_running_out_of_memory() -> None:
    from deltabench.harness.errors import is_out_of_memory

    assert is_out_of_memory(MemoryError())
    assert is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB"))
    assert is_out_of_memory(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 GB"))
    assert is_out_of_memory("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 MiB")
    assert is_out_of_memory("XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1.2GiB")
    # a kernel asking for more shared memory than a block may have is the kernel's own fault, not the device's
    assert not is_out_of_memory("JaxRuntimeError: RESOURCE_EXHAUSTED: Shared memory size limit exceeded: 360448")
    assert not is_out_of_memory(RuntimeError("CUDA error: an illegal memory access was encountered"))


def test_the_cli_gates_the_fresh_process(capsys: pytest.CaptureFixture[str]) -> None:
    shape = ",".join(f"{k}={v}" for k, v in SHAPE.items())
    args = ["verify", "--op", "sdm", "--impl", "torch_chunk", "--shape", shape, "--dtype", "fp32", "--seeds", "1"]
    with pytest.raises(SystemExit) as exit_info:
        main([*args, "--regime", "typical", "--device", "cpu", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert exit_info.value.code == 0
    (rec,) = [r for r in out["records"] if r["check"] == "determinism:process"]
    assert rec["gating"] and rec["passed"] and rec["detail"] == "bitwise identical"
