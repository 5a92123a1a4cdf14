"""An impl's JIT kernels listed by a dry run of its calls, then compiled side by side.

A kernel library that compiles each kernel on its first call builds the kernels of one call one after another:
FlashQLA's TileLang kernels take 15 to 50 s each (TVM, then nvcc), a forward and backward holds about a dozen,
and a gate calls it at some eight shapes with and without an initial state. A dry run of the same calls, with the
library's JIT factory swapped for a recorder, lists the kernels they would build (each a factory and its
compile-time arguments) without building any: every factory returns an inert kernel that launches nothing, so the
dry run's outputs are garbage and nothing is checked. Each distinct kernel is then built in a process of its own,
side by side, into the library's on-disk cache, where the real calls find it. Shapes that differ only in what the
library passes at launch (TileLang's dynamic batch and length) share one kernel, which is built once.

A library is named by a :class:`JitFamily` in :data:`FAMILIES` (``ImplDecl.jit``). Nothing here imports the
library until a dry run or a build needs it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import multiprocessing
import os
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any

__all__ = [
    "FAMILIES",
    "TILELANG",
    "BuildSummary",
    "JitFamily",
    "NotRecordable",
    "Unit",
    "build_side_by_side",
    "distinct",
    "family",
    "first_line",
    "resolve",
]


class NotRecordable(RuntimeError):
    """A factory call a dry run cannot stand in for (its kernel runs at once and returns outputs)."""


@dataclasses.dataclass(frozen=True)
class Unit:
    """One kernel to build: the module-level factory ``module.name`` called with `args` and `kwargs`."""

    module: str
    name: str
    args: tuple[Any, ...]
    kwargs: tuple[tuple[str, Any], ...] = ()

    def key(self) -> str:
        """What makes two units the same kernel: the factory and every argument's repr."""
        return repr((self.module, self.name, self.args, self.kwargs))


@dataclasses.dataclass(frozen=True)
class JitFamily:
    """A JIT library whose kernels a dry run can list.

    Attributes:
        name: as an impl declares it (``ImplDecl.jit``).
        recording: a context manager under which the library's factories are recorded instead of building
            anything; it yields the list the units are appended to, in call order.
        build: builds one unit into the library's on-disk cache (run in a process of its own; a module-level
            function, so that it pickles by name).
    """

    name: str
    recording: Callable[[], contextlib.AbstractContextManager[list[Unit]]]
    build: Callable[[Unit], None]


@dataclasses.dataclass
class BuildSummary:
    """What :func:`build_side_by_side` did."""

    units: int
    built: int
    workers: int
    wall_s: float
    slowest: tuple[str, float] | None = None  # the unit that took longest, and its seconds
    failures: list[str] = dataclasses.field(default_factory=list)  # "factory: error", one per unit that failed

    def line(self) -> str:
        """One line for a log: how many kernels were built, how, how long, and the first failure."""
        text = f"{self.built} of {self.units} kernels built, {self.workers} at once, in {self.wall_s:.1f} s"
        if self.slowest:
            text += f" (longest {self.slowest[0]} {self.slowest[1]:.1f} s)"
        if self.failures:
            text += f"; {len(self.failures)} failed, first: {self.failures[0]}"
        return text


def first_line(exc: BaseException) -> str:
    """`exc` as one short line for a log: its type and its message's first line."""
    message = str(exc).splitlines()[0][:160] if str(exc) else ""
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def distinct(units: Iterable[Unit]) -> list[Unit]:
    """`units` without repeats (:meth:`Unit.key`), in first-call order."""
    seen: dict[str, Unit] = {}
    for unit in units:
        seen.setdefault(unit.key(), unit)
    return list(seen.values())


def resolve(unit: Unit) -> Any:
    """The factory object `unit` names (``module.name``, a dotted name within the module)."""
    obj: Any = importlib.import_module(unit.module)
    for part in unit.name.split("."):
        obj = getattr(obj, part)
    return obj


def _timed_build(build: Callable[[Unit], None], unit: Unit) -> float:
    """Build `unit` with `build`; its seconds (run in a worker process)."""
    t0 = time.perf_counter()
    build(unit)
    return time.perf_counter() - t0


def build_side_by_side(
    build: Callable[[Unit], None],
    units: list[Unit],
    *,
    workers: int | None = None,
) -> BuildSummary:
    """Build every unit with `build`, each in a worker process, up to `workers` at once (default: three quarters of
    the CPUs, the rest left to the gates running beside). A unit that fails, or a worker that dies, is counted and
    named, never raised: what was not built here the real call builds itself."""
    if workers is None:
        workers = max(1, (os.cpu_count() or 2) * 3 // 4)
    workers = max(1, min(workers, len(units)))
    summary = BuildSummary(units=len(units), built=0, workers=workers, wall_s=0.0)
    if not units:
        return summary
    t0 = time.perf_counter()
    # spawn, not fork: the parent may hold a CUDA context, which a forked child cannot use
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(_timed_build, build, unit): unit for unit in units}
        for future in as_completed(futures):
            unit = futures[future]
            try:
                seconds = future.result()
            except Exception as exc:
                summary.failures.append(f"{unit.name}: {first_line(exc)}")
            else:
                summary.built += 1
                if summary.slowest is None or seconds > summary.slowest[1]:
                    summary.slowest = (unit.name, seconds)
    summary.wall_s = time.perf_counter() - t0
    return summary


@contextlib.contextmanager
def _replaced(owner: Any, attr: str, value: Any) -> Iterator[None]:
    """`owner.attr` set to `value` for the block, then put back."""
    original = getattr(owner, attr)
    setattr(owner, attr, value)
    try:
        yield
    finally:
        setattr(owner, attr, original)


class InertKernel:
    """What a recorded factory returns in a dry run: a kernel whose launch does nothing."""

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        return None


@contextlib.contextmanager
def _tilelang_recording() -> Iterator[list[Unit]]:
    """TileLang's ``@tilelang.jit`` factories recorded (``JITImpl.__call__``): each call appends its unit and
    returns an :class:`InertKernel`. Only lazy factories (that return a kernel for the caller to launch on
    buffers it made, as FlashQLA's do) can be stood in for; an eager one, which launches at once and returns
    outputs, raises :class:`NotRecordable`."""
    from tilelang.jit import JITImpl

    units: list[Unit] = []

    def record(self: Any, *args: Any, **kwargs: Any) -> InertKernel:
        orig = getattr(self.func, "orig_func", None)
        if self.mode == "eager" or orig is None:
            raise NotRecordable(f"TileLang factory {getattr(orig, '__name__', self.func)!r} is not a lazy one")
        units.append(Unit(orig.__module__, orig.__qualname__, args, tuple(sorted(kwargs.items()))))
        return InertKernel()

    with _replaced(JITImpl, "__call__", record):
        yield units


def _tilelang_build(unit: Unit) -> None:
    """Build one TileLang kernel into TileLang's on-disk cache: its factory called with the recorded arguments."""
    from tilelang.jit import JITImpl

    factory = resolve(unit)
    if not isinstance(factory, JITImpl):
        raise TypeError(f"{unit.module}.{unit.name} is not a TileLang JIT factory")
    factory(*unit.args, **dict(unit.kwargs))


TILELANG = JitFamily("tilelang", _tilelang_recording, _tilelang_build)
FAMILIES: dict[str, JitFamily] = {TILELANG.name: TILELANG}


def family(name: str) -> JitFamily:
    """The :class:`JitFamily` called `name`; ValueError naming the known ones otherwise."""
    try:
        return FAMILIES[name]
    except KeyError:
        raise ValueError(f"unknown JIT family {name!r}: known ones are {', '.join(sorted(FAMILIES))}") from None
