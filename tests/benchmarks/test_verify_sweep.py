"""benchmarks/gpu/verify_sweep.py on the CPU: each line in its own child process, so a kernel that kills its
process or hangs fails its line only (with the reason) and the next line still runs; shapes per op by its dims."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "gpu" / "verify_sweep.py"
TINY_GDN = "B=1,T=40,H=1,K=8,V=8"

# Named so that they sort before torch_recurrent: the line after the crash is a real impl's.
BAD_KERNELS = textwrap.dedent(
    """
    import os
    import signal
    import time

    from deltabench.harness import register_impl

    def _register(name, fn):
        register_impl("gdn", name, backend="torch", devices=("cpu",), dtypes=("fp32",))(fn)

    def kills_itself(q, k, v, g, beta, scale=None, initial_state=None):
        os.kill(os.getpid(), signal.SIGSEGV)

    def hangs(q, k, v, g, beta, scale=None, initial_state=None):
        time.sleep(3600)

    _register("aa_kills_itself", kills_itself)
    _register("aa_hangs", hangs)

    from deltabench.kernels.gdn import gdn_torch_recurrent

    register_impl(
        "gdn", "aa_even_heads", backend="torch", devices=("cpu",), dtypes=("fp32",),
        constraint=lambda case: None if case.H % 2 == 0 else "an even number of heads only",
    )(gdn_torch_recurrent)
    """
)


@pytest.fixture(scope="module")
def kernels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sweep") / "bad_kernels.py"
    path.write_text(BAD_KERNELS)
    return path


def _sweep(*args: str) -> subprocess.CompletedProcess:
    """Run the sweep on the CPU at fp32, one seed, single-threaded torch (the CI machine has 2 cores)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(SCRIPT), "--device", "cpu", "--dtype", "fp32", "--seeds", "1", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)


def test_a_line_that_kills_its_process_fails_alone(kernels: Path) -> None:
    run = _sweep(
        "--impl", "aa_kills_itself", "--impl", "torch_recurrent", "--op", "gdn", "--op", "sdm",
        "--shape", TINY_GDN, "--import", str(kernels),
    )  # fmt: skip
    lines = [ln for ln in run.stdout.splitlines() if not ln.startswith("     ")]
    assert run.returncode == 1, run.stdout + run.stderr[-2000:]
    assert len(lines) == 4, run.stdout
    assert lines[0].startswith("FAIL gdn aa_kills_itself fp32 B1-T40-H1-K8-V8 "), lines[0]
    assert "crashed in call: killed by signal SIGSEGV" in lines[0] and "kills_itself" in lines[0]
    assert lines[1].startswith("PASS gdn torch_recurrent fp32 B1-T40-H1-K8-V8 "), lines[1]
    assert "worst/bound output=" in lines[1] and "grad=" in lines[1]
    # --shape names gdn's dims only: sdm keeps its own small default
    assert lines[2].startswith("PASS sdm torch_recurrent fp32 B1-T70-H3-D16-R4-S64-W4 "), lines[2]
    assert lines[3] == "3 line(s): 2 PASS, 1 FAIL, 0 SKIP"


def test_a_line_that_hangs_is_killed_at_the_line_timeout(kernels: Path) -> None:
    run = _sweep("--impl", "aa_hangs", "--op", "gdn", "--shape", TINY_GDN, "--import", str(kernels),
                 "--line-timeout", "10")  # fmt: skip
    lines = run.stdout.splitlines()
    assert run.returncode == 1, run.stdout + run.stderr[-2000:]
    assert lines[0].startswith("FAIL gdn aa_hangs fp32 B1-T40-H1-K8-V8 "), lines[0]
    assert "hung in call: no result after 10 s (--line-timeout)" in lines[0]
    assert lines[-1] == "1 line(s): 0 PASS, 1 FAIL, 0 SKIP"


def test_a_shape_naming_an_ops_dims_must_be_complete() -> None:
    run = _sweep("--impl", "torch_recurrent", "--op", "gdn", "--shape", "B=1,T=40,K=8")
    assert run.returncode == 2 and "lacks H" in run.stderr, run.stderr[-2000:]
    assert run.stdout == ""


def test_jobs_verify_lines_side_by_side(kernels: Path) -> None:
    # the hanging line is first in sweep order; with two at once the real impl's line ends (and prints) before it
    run = _sweep("--impl", "aa_hangs", "--impl", "torch_recurrent", "--op", "gdn", "--shape", TINY_GDN,
                 "--import", str(kernels), "--line-timeout", "40", "--jobs", "2")  # fmt: skip
    lines = [ln for ln in run.stdout.splitlines() if not ln.startswith("     ")]
    assert run.returncode == 1, run.stdout + run.stderr[-2000:]
    assert lines[0].startswith("PASS gdn torch_recurrent fp32 B1-T40-H1-K8-V8 "), run.stdout
    assert lines[1].startswith("FAIL gdn aa_hangs fp32 B1-T40-H1-K8-V8 ") and "no result after 40 s" in lines[1]
    assert lines[2] == "2 line(s): 1 PASS, 1 FAIL, 0 SKIP"


def test_jobs_must_be_positive() -> None:
    run = _sweep("--impl", "torch_recurrent", "--jobs", "0")
    assert run.returncode == 2 and "--jobs must be at least 1" in run.stderr, run.stderr[-2000:]


def test_an_impl_that_needs_an_even_h_is_verified_at_h_plus_one(kernels: Path) -> None:
    run = _sweep("--impl", "aa_even_heads", "--op", "gdn", "--import", str(kernels), "--wide-shape",
                 "B=1,T=20,H=3,K=16,V=16", "--wide-only")  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr[-2000:]
    assert run.stdout.startswith("PASS gdn aa_even_heads fp32 B1-T20-H4-K16-V16 "), run.stdout
