"""deltabench's JAX compilation settings: the persistent cache's directory and the cheap-CPU-compile opt-in."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("jax")

SNIPPET = """
import os, jax
from deltabench.kernels.common.jax import jax_compile
print(jax_compile.enable_persistent_cache())
print(jax_compile.use_fast_cpu_compilation() if os.environ.get("WANT_FAST") else None)
print(os.environ.get("XLA_FLAGS", ""))
print(float(jax.numpy.arange(4.0).sum()))
"""


def run_fresh(**env: str) -> list[str]:
    """Run SNIPPET in a fresh interpreter (XLA reads its flags once per process) with `env` added."""
    full = {**os.environ, "JAX_PLATFORMS": "cpu", **env}
    full.pop("XLA_FLAGS", None)
    full.pop("DELTABENCH_JAX_FAST_COMPILE_PROBED", None)
    done = subprocess.run([sys.executable, "-c", SNIPPET], env=full, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_cache_directory_and_fast_flags_in_a_fresh_process(tmp_path) -> None:
    cache, fast, flags, total = run_fresh(DELTABENCH_JAX_CACHE_DIR=str(tmp_path / "cache"), WANT_FAST="1")
    assert cache == str(tmp_path / "cache")
    assert fast == "True"
    # the flags reached XLA and it ran with them (an unknown flag would have aborted the process)
    assert "--xla_backend_optimization_level=0" in flags.split()
    assert total == "6.0"


def test_cache_can_be_switched_off() -> None:
    cache, fast, flags, _ = run_fresh(DELTABENCH_JAX_CACHE_DIR="off")
    assert cache == "None" and fast == "None" and flags == ""
