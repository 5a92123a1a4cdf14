"""Fixtures of the runner tests.

- ``tiny_suite``: writes a suite file of tiny gdn jobs on the CPU (one fwd job per impl, fp32, a short timing
  budget, the gate at one seed), the case the end-to-end tests of ``deltabench run`` time, repeat and interleave.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

_TINY_SUITE = """\
name = "{name}"
device = "cpu"
shapes = ["B=1,T=32,H=1,K=8,V=8"]
dtypes = ["fp32"]
modes = ["fwd"]
timeout_s = 120
[timing]
budget_s = 0.05
min_reps = 10
warmup_s = 0.02
cpu_threads = 1
[gate]
seeds = 1
extra_seed = false
[ops.gdn]
impls = [{impls}]
baseline = "{baseline}"
"""


def _write_tiny_suite(path: Path, *impls: str) -> Path:
    """The suite of `impls` (the first the baseline; default torch_chunk), named after `path`, written there."""
    impls = impls or ("torch_chunk",)
    text = _TINY_SUITE.format(name=path.stem, impls=", ".join(f'"{i}"' for i in impls), baseline=impls[0])
    path.write_text(text)
    return path


@pytest.fixture(scope="session")
def tiny_suite() -> Callable[..., Path]:
    """``tiny_suite(path, *impls) -> path``: a suite file of one tiny gdn fwd job per impl on the CPU (B=1, T=32,
    H=1, K=V=8, fp32; timed for 0.05 s, at least 10 samples, one thread; gated with one seed)."""
    return _write_tiny_suite
