"""``deltabench verify`` outlives its kernel: a segfault, a hang, an --import that exits, an impossible shape and
an out-of-memory error each end in one clear line and the right exit code; ``run`` refuses impossible shapes and
classifies a CPU out-of-memory job as ``oom``."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from deltabench.cli.app import main
from deltabench.correctness.memory_need import estimate_need, host_memory_available
from deltabench.harness.cases import Case

TINY = ["--shape", "B=1,T=40,H=1,K=8,V=8", "--dtype", "fp32", "--device", "cpu", "--seeds", "1"]
TORCH_CPU_OOM = (
    "[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: you tried to allocate "
    "1099511627776 bytes. Error code 12 (Cannot allocate memory)"
)

BAD_KERNELS = textwrap.dedent(
    f"""
    import ctypes
    import time

    from deltabench.harness import get_impl, register_impl

    def _register(name, fn):
        register_impl("gdn", name, backend="torch", devices=("cpu",), dtypes=("fp32",))(fn)

    def segfaults(q, k, v, g, beta, scale=None, initial_state=None):
        ctypes.string_at(0)  # reads address 0: SIGSEGV

    def hangs(q, k, v, g, beta, scale=None, initial_state=None):
        time.sleep(3600)

    def torch_oom(q, k, v, g, beta, scale=None, initial_state=None):
        raise RuntimeError({TORCH_CPU_OOM!r})

    def memory_error(q, k, v, g, beta, scale=None, initial_state=None):
        raise MemoryError()

    def good(q, k, v, g, beta, scale=None, initial_state=None):
        return get_impl("gdn", "torch_chunk")(q, k, v, g, beta, scale=scale, initial_state=initial_state)

    _register("iso_segfaults", segfaults)
    _register("iso_hangs", hangs)
    _register("iso_torch_oom", torch_oom)
    _register("iso_memory_error", memory_error)
    _register("iso_good", good)
    """
)


@pytest.fixture(scope="module")
def kernels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("isolation") / "bad_kernels.py"
    path.write_text(BAD_KERNELS)
    return path


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """Run the CLI in this process (the kernel runs in verify's child); returns (exit code, stdout, stderr)."""
    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
    out, err = capsys.readouterr()
    return int(exit_info.value.code or 0), out, err


def test_a_segfaulting_kernel_is_a_failing_record(capsys: pytest.CaptureFixture[str], kernels: Path) -> None:
    code, out, _ = run_cli(capsys, "verify", "--op", "gdn", "--impl", "iso_segfaults", *TINY, "--import", str(kernels))
    assert code == 1
    lines = out.strip().splitlines()
    assert len(lines) == 1, out
    assert lines[0].startswith("FAIL gdn/iso_segfaults crashed in call: killed by signal SIGSEGV"), out
    assert "string_at" in lines[0]  # faulthandler's innermost frame: where the kernel died
    code, out, _ = run_cli(
        capsys, "verify", "--op", "gdn", "--impl", "iso_segfaults", *TINY, "--import", str(kernels), "--json"
    )
    doc = json.loads(out)
    assert code == 1 and doc["passed"] is False and doc["signal"] == "SIGSEGV" and doc["phase"] == "call"
    assert [(r["check"], r["passed"], r["gating"]) for r in doc["records"]] == [("crash", False, True)]


def test_a_hanging_kernel_is_killed_at_the_timeout(capsys: pytest.CaptureFixture[str], kernels: Path) -> None:
    start = time.monotonic()
    # 20 s: the child imports torch first, which takes a few seconds on a busy machine.
    code, out, _ = run_cli(
        capsys, "verify", "--op", "gdn", "--impl", "iso_hangs", *TINY, "--import", str(kernels), "--timeout", "20"
    )
    elapsed = time.monotonic() - start
    assert code == 1
    assert "FAIL gdn/iso_hangs hung in call: no result after 20 s (--timeout); process group killed" in out
    assert 20 <= elapsed < 60


def test_an_import_that_exits_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    exits = tmp_path / "exits.py"
    exits.write_text("import sys\nsys.exit(3)\n")
    raises = tmp_path / "raises.py"
    raises.write_text("raise RuntimeError('broken at import')\n")
    for path, message in ((exits, "called sys.exit(3) while being imported"), (raises, "RuntimeError: broken")):
        code, out, err = run_cli(capsys, "verify", "--op", "gdn", "--impl", "x", *TINY, "--import", str(path))
        assert code == 2 and out == ""
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("deltabench: error: --import") and message in lines[0], err


@pytest.mark.parametrize("shape", ["B=1000000,T=200,H=4,K=64,V=64", "B=2,T=100000000,H=4,K=64,V=64"])
def test_an_impossible_shape_is_exit_2_with_the_estimate(capsys: pytest.CaptureFixture[str], shape: str) -> None:
    need = estimate_need(Case("gdn", **_dims(shape), dtype="bf16", mode="fwd+bwd", device="cpu"))
    available = host_memory_available()
    assert available is not None and need.total > available  # the premise: this machine cannot hold it
    start = time.monotonic()
    code, out, err = run_cli(capsys, "verify", "--op", "gdn", "--impl", "torch_chunk", "--shape", shape,
                             "--device", "cpu", "--dtype", "bf16")  # fmt: skip
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "needs at least" in lines[0] and "of host memory (inputs" in lines[0] and "is available" in lines[0]
    assert time.monotonic() - start < 60  # refused up front, not after drawing terabytes


def _dims(shape: str) -> dict[str, int]:
    return {k: int(v) for k, v in (part.split("=") for part in shape.split(","))}


def test_the_estimate_counts_what_the_case_needs() -> None:
    """Lower bounds from the inputs' shapes: fp32 drawing, the impl's copy on the CPU, the oracle in float64."""
    small = Case("gdn", B=1, T=72, H=2, K=16, V=32, dtype="bf16", mode="fwd", device="cpu")
    need = estimate_need(small, reference="oracle")
    q_k_v_g_beta = 72 * 2 * (16 + 16 + 32 + 1 + 1)
    o, state = 72 * 2 * 32, 2 * 16 * 32
    assert need.inputs == 4 * (q_k_v_g_beta + o + state)
    assert need.reference == 8 * (q_k_v_g_beta + o + state)
    assert estimate_need(small.replace(device="cuda")).impl == 0  # a GPU's memory is not host memory
    doubled = estimate_need(small.replace(B=2), reference="oracle")
    assert doubled.total == pytest.approx(2 * need.total)


def test_an_out_of_memory_kernel_is_reported_as_such(capsys: pytest.CaptureFixture[str], kernels: Path) -> None:
    code, out, _ = run_cli(capsys, "verify", "--op", "gdn", "--impl", "iso_torch_oom", *TINY, "--import", str(kernels))
    assert code == 1 and "can't allocate memory" in out and "(in call, out of memory)" in out, out


def test_verify_still_passes_a_good_user_kernel(capsys: pytest.CaptureFixture[str], kernels: Path) -> None:
    code, out, _ = run_cli(capsys, "verify", "--op", "gdn", "--impl", "iso_good", *TINY, "--import", str(kernels))
    assert code == 0 and "PASS" in out, out


SUITE = """
name = "{name}"
device = "cpu"
shapes = ["{shape}"]
dtypes = ["fp32"]
modes = ["fwd"]
timeout_s = 120

[gate]
seeds = 1
extra_seed = false

[ops.gdn]
impls = {impls}
"""


def _suite(tmp_path: Path, name: str, shape: str, impls: list[str]) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(SUITE.format(name=name, shape=shape, impls=json.dumps(impls)))
    return path


def test_run_refuses_an_impossible_shape_before_any_job(tmp_path: Path) -> None:
    suite = _suite(tmp_path, "huge", "B=1000000,T=200,H=4,K=64,V=64", ["torch_chunk"])
    proc = subprocess.run(
        [sys.executable, "-m", "deltabench.cli.app", "run", "--suite", str(suite), "--no-db"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "gdn/torch_chunk at B1000000-T200-H4-K64-V64" in lines[0], proc.stderr
    assert "needs at least" in lines[0] and "is available" in lines[0]


def test_run_classifies_cpu_out_of_memory_as_oom(tmp_path: Path, kernels: Path) -> None:
    suite = _suite(tmp_path, "oom", "B=1,T=40,H=1,K=8,V=8", ["iso_torch_oom", "iso_memory_error", "iso_good"])
    out = tmp_path / "doc.json"
    proc = subprocess.run(
        [sys.executable, "-m", "deltabench.cli.app", "run", "--suite", str(suite), "--no-db",
         "--import", str(kernels), "--out", str(out), "--format", "json"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    doc = json.loads(out.read_text())
    statuses = {j["impl"]: (j["status"], j["reason"]) for j in doc["jobs"]}
    assert statuses["iso_good"][0] == "ok"
    assert statuses["iso_torch_oom"][0] == "oom" and "can't allocate memory" in statuses["iso_torch_oom"][1]
    assert statuses["iso_memory_error"][0] == "oom" and "MemoryError" in statuses["iso_memory_error"][1]
