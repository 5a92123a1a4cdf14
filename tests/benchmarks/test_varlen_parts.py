"""benchmarks/gpu/varlen_parts.py on the CPU (``--device cpu``, the Triton interpreter, tiny shapes): the code a device
call relies on runs to its end here, with one line per impl and mode, the outputs of one op's impls agreeing."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "gpu" / "varlen_parts.py"
ENV = {**os.environ, "TRITON_INTERPRET": "1"}


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600, env=ENV)


def test_packed_and_dense_lines_for_each_impl_and_mode() -> None:
    run = _run(
        "--device", "cpu", "--dtype", "fp32", "--seqlens", "17,64,1,46", "--heads", "2", "--head-size", "16",
        "--impls", "gdn:triton_chunk_auto,gdn:torch_chunk,kda:torch_chunk",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    assert "4 sequences, 128 tokens (shortest 1, longest 64), H=2, K=V=16" in run.stdout
    line = r"^{mode} {impl}: packed \d+\.\d+ ms, dense \d+\.\d+ ms, packed / dense \d+\.\d+ \| o vs first (\S+)$"
    for mode in ("fwd", "fwd\\+bwd"):
        for impl in ("gdn:triton_chunk_auto", "gdn:torch_chunk", "kda:torch_chunk"):
            found = re.search(line.format(mode=mode, impl=impl), run.stdout, re.M)
            assert found, (mode, impl, run.stdout)
            assert float(found.group(1)) < 1e-4


def test_an_unknown_impl_or_length_spec_exits_2() -> None:
    run = _run("--device", "cpu", "--impls", "gdn:nope")
    assert run.returncode == 2 and "unknown impl 'nope'" in run.stderr
    run = _run("--device", "cpu", "--seqlens", "lognormal(mean=2048)")
    assert run.returncode == 2 and run.stderr.startswith("varlen_parts.py: ")
