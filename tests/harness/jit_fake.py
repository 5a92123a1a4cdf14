"""A stand-in JIT library for the tests of kernels/common/jit_units.py and correctness/compile_ahead.py (no torch: its
builds run in spawned processes, which import this module by name).

A factory called with compile-time arguments "builds" its kernel: it writes a file named after them into
``$JIT_FAKE_DIR`` holding the builder's pid and its start and end times, taking ``$JIT_FAKE_BUILD_S`` seconds, unless
the file is there already (its on-disk cache); it then returns a kernel that does nothing. A dry run (:func:`recording`)
swaps the factories' call for a recorder, as jit_units does for TileLang.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from deltabench.kernels.common.jit_units import InertKernel, JitFamily, NotRecordable, Unit, resolve


class Factory:
    """A lazy factory: called with compile-time arguments, it builds (once, cached on disk) and returns a kernel."""

    eager = False

    def __init__(self, name: str) -> None:
        self.name = name

    def path(self, *args: Any) -> Path:
        return Path(os.environ["JIT_FAKE_DIR"]) / "-".join([self.name, *map(str, args)])

    def __call__(self, *args: Any) -> InertKernel:
        path = self.path(*args)
        if not path.exists():
            if "fail" in args:
                raise RuntimeError(f"{self.name} cannot build {args}")
            if "die" in args:
                os._exit(3)
            t0 = time.time()
            time.sleep(float(os.environ.get("JIT_FAKE_BUILD_S", "0")))
            path.write_text(f"{os.getpid()} {t0} {time.time()}")
        return InertKernel()


forward = Factory("forward")
backward = Factory("backward")
eager = Factory("eager")
eager.eager = True


@contextlib.contextmanager
def recording() -> Iterator[list[Unit]]:
    """The factories recorded: each call appends its unit and returns an inert kernel; an eager one refuses."""
    units: list[Unit] = []
    original = Factory.__call__

    def record(self: Factory, *args: Any) -> InertKernel:
        if self.eager:
            raise NotRecordable(f"{self.name} is eager")
        units.append(Unit(__name__, self.name, args))
        return InertKernel()

    Factory.__call__ = record  # type: ignore[method-assign]
    try:
        yield units
    finally:
        Factory.__call__ = original  # type: ignore[method-assign]


def build(unit: Unit) -> None:
    """Build one unit: its factory called with its arguments."""
    resolve(unit)(*unit.args)


FAMILY = JitFamily("jit_fake", recording, build)


def register(name: str, *, forward: Factory = forward, tag: str = "") -> None:
    """Register gdn impl `name` on the CPU, of this family: its call builds (or finds) a forward kernel per (K, V,
    initial state), and a backward kernel per (K, V) when it will be back-propagated, then computes with
    torch_chunk; the family goes into jit_units.FAMILIES."""
    import torch

    from deltabench.harness.registry import get_impl, register_impl
    from deltabench.kernels.common import jit_units

    jit_units.FAMILIES[FAMILY.name] = FAMILY
    chunk = get_impl("gdn", "torch_chunk")

    def fn(q, k, v, g, beta, scale=None, initial_state=None):
        K, V = q.shape[-1], v.shape[-1]
        forward(K, V, initial_state is not None, *([tag] if tag else []))(q, k, v)
        if torch.is_grad_enabled() and q.requires_grad:
            backward(K, V)(q, k, v)
        return chunk.fn(q, k, v, g, beta, scale=scale, initial_state=initial_state)

    register_impl("gdn", name, backend="torch", devices=("cpu",), dtypes=("fp32",), jit=FAMILY.name)(fn)


def built(directory: Path) -> dict[str, tuple[int, float, float]]:
    """What was built in `directory`: kernel name -> (builder pid, start, end)."""
    out = {}
    for path in directory.iterdir():
        if path.is_dir():
            continue
        pid, t0, t1 = path.read_text().split()
        out[path.name] = (int(pid), float(t0), float(t1))
    return out
