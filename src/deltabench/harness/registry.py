"""The impl registry: named implementations of an op, with what they need and where they run.

An impl is a callable with its op's signature (the delta family's ``fn(q, k, v, *gates, scale=None,
initial_state=None) -> (o, final_state)``), registered with :func:`register_impl`. Built-in impls are declared
beside their kernels, as plain data (``IMPLS``, a tuple of kernels/declare.ImplDecl, in each ``kernels/<op>/``
package and in ``kernels/external``): the registry collects every such package (kernels/ never imports the
harness). Third-party packages register through the entry-point groups ``deltabench.ops`` (harness/ops.py) and
``deltabench.impls`` (each entry point names a module to import, or a callable to call); ``load_module`` imports a
user's module or ``.py`` file that calls ``register_op`` and ``register_impl`` (or :func:`register_impls`).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from deltabench.kernels.declare import ImplDecl

from .cases import MODES, Case, has_backward, parse_dtype
from .devices import absent_reason, parse_device
from .errors import BadInput, ImplUnavailable, UnknownImpl
from .ops import OPS, get_op, load_entry_point_ops

__all__ = [
    "Impl",
    "ImplDecl",
    "all_impls",
    "get_impl",
    "impls_for",
    "lazy",
    "load_module",
    "register_impl",
    "register_impls",
]

BACKENDS = ("torch", "triton", "jax", "cuda")
_REGISTRY: dict[tuple[str, str], Impl] = {}
_LOADED = False


@dataclasses.dataclass
class Impl:
    """A registered implementation of an op."""

    op: str
    name: str
    fn: Callable[..., Any]
    backend: str
    devices: tuple[str, ...]
    dtypes: tuple[str, ...]
    supports_backward: bool = True
    constraint: Callable[[Case], str | None] | None = None
    requires: tuple[str, ...] = ()  # importable modules it needs (checked without importing them)
    state_grad: bool = True  # the final state carries a gradient (kernels/declare.ImplDecl.state_grad)
    compiles_per_shape: bool = False  # gated job by job side by side (kernels/declare.ImplDecl.compiles_per_shape)
    autotunes: bool = False  # its gates kept in one process per tuning group (kernels/declare.ImplDecl.autotunes)
    jit: str = ""  # the JIT library whose kernels a dry run lists (kernels/declare.ImplDecl.jit)
    varlen: bool = False  # takes packed sequences, cu_seqlens= (kernels/declare.ImplDecl.varlen)
    source: str = "builtin"  # "builtin", an entry point, or a user module path
    notes: str = ""  # shown by `deltabench list` and stored with results (e.g. a bypassed guard)
    modes: tuple[str, ...] = ()  # the modes it runs; empty: all its backward allows (kernels/declare.ImplDecl.modes)
    state_in_place: bool = False  # writes the new state into the buffer given (kernels/declare.ImplDecl)

    def missing_requirement(self) -> str | None:
        """The reason this impl cannot be imported here, or None."""
        for mod in self.requires:
            try:
                found = importlib.util.find_spec(mod) is not None
            except (ImportError, ValueError):
                found = False
            if not found:
                return f"needs the Python package {mod!r}, which is not installed"
        return None

    def unavailable_reason(self, device: str) -> str | None:
        """Why this impl cannot run on `device` on this machine, or None if it can."""
        why = self.missing_requirement()
        if why:
            return why
        platform = parse_device(device).platform
        if platform not in self.devices:
            return f"runs on {', '.join(self.devices)}, not {platform}"
        why = absent_reason(device)
        if why:
            return why
        if platform == "cpu" and self.backend == "triton" and os.environ.get("TRITON_INTERPRET") != "1":
            return "Triton runs on the CPU only under the interpreter (set TRITON_INTERPRET=1)"
        return None

    def check_case(self, case: Case) -> str | None:
        """Why this impl cannot run `case`, or None: dtype, backward, device, then its own constraint."""
        if case.dtype not in self.dtypes:
            return f"supports {', '.join(self.dtypes)}, not {case.dtype}"
        if self.modes and case.mode not in self.modes:
            return f"runs mode {', '.join(self.modes)}, not {case.mode}"
        if has_backward(case.mode) and not self.supports_backward:
            return "forward only (no backward)"
        if case.seqlens is not None and not self.varlen:
            return "does not take cu_seqlens (packed variable-length sequences)"
        why = self.unavailable_reason(case.device)
        if why:
            return why
        return self.constraint(case) if self.constraint else None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)


def register_impl(
    op: str,
    name: str,
    *,
    backend: str,
    devices: tuple[str, ...],
    dtypes: tuple[str, ...],
    supports_backward: bool = True,
    constraint: Callable[[Case], str | None] | None = None,
    requires: tuple[str, ...] = (),
    notes: str = "",
    state_grad: bool = True,
    compiles_per_shape: bool = False,
    autotunes: bool = False,
    jit: str = "",
    modes: tuple[str, ...] = (),
    state_in_place: bool = False,
    varlen: bool = False,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register the decorated function as impl `name` of `op`; returns the function unchanged.

    Example::

        @register_impl("gdn", "my_chunk", backend="triton", devices=("cuda",), dtypes=("bf16", "fp32"))
        def my_chunk(q, k, v, g, beta, scale=None, initial_state=None):
            ...
            return o, final_state

    `constraint(case)` returns None when the impl can run the case, else the reason it cannot.
    `state_grad=False` declares a final state returned without a gradient (the gate's cotangent then goes on the output
    alone). `compiles_per_shape=True` declares a kernel that compiles each new shape for a long time without autotuning:
    a run with ``--gate-workers`` N > 1 gates each of its jobs in a process of its own, side by side with the others,
    rather than all of them in one process; `jit="tilelang"` (kernels/common/jit_units.py) lets such a run list its
    kernels by a dry run and build each once, side by side, before those gates. `autotunes=True` declares a kernel
    that picks its launch configurations by timing them (``triton.autotune``): the gates of one tuning group (the same
    dims but B and T, and dtype) stay in one process, so that each configuration is tuned once, and the timing uses
    the pick its gate checked (made on a device the run's other gates may share). `modes` narrows the modes it runs
    (``("decode",)`` for a decode kernel; empty: every mode its backward allows); `state_in_place=True` declares
    that it writes the new state into the state buffer it is given (the gate checks that buffer). `varlen=True`
    declares an impl that takes packed sequences (``cu_seqlens=``, FLA's convention); one without is refused at a
    packed case. Registering a name twice replaces the earlier entry (a user's file may be re-imported).
    """
    get_op(op)
    if backend not in BACKENDS:
        raise BadInput(f"impl {name!r}: unknown backend {backend!r}, expected one of {', '.join(BACKENDS)}")
    if jit:
        from deltabench.kernels.common.jit_units import FAMILIES

        if jit not in FAMILIES:
            raise BadInput(f"impl {name!r}: unknown jit {jit!r}, expected one of {', '.join(sorted(FAMILIES))}")
    dts = tuple(parse_dtype(d) for d in dtypes)
    unknown_modes = [m for m in modes if m not in MODES]
    if unknown_modes:
        raise BadInput(f"impl {name!r}: unknown mode {unknown_modes[0]!r}, expected some of {', '.join(MODES)}")

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        _REGISTRY[(op, name)] = Impl(
            op=op,
            name=name,
            fn=fn,
            backend=backend,
            devices=tuple(devices),
            dtypes=dts,
            supports_backward=supports_backward,
            constraint=constraint,
            requires=tuple(requires),
            state_grad=state_grad,
            compiles_per_shape=compiles_per_shape,
            autotunes=autotunes,
            jit=jit,
            modes=tuple(modes),
            state_in_place=state_in_place,
            varlen=varlen,
            source=getattr(fn, "__deltabench_source__", _source_of(fn)),
            notes=notes,
        )
        return fn

    return decorate


def register_impls(decls: Any) -> None:
    """Register every declaration of `decls` (kernels/declare.ImplDecl), each imported lazily on its first call."""
    for d in decls:
        register_impl(
            d.op,
            d.name,
            backend=d.backend,
            devices=d.devices,
            dtypes=d.dtypes,
            supports_backward=d.backward,
            constraint=d.constraint,
            requires=d.requires,
            notes=d.notes,
            state_grad=d.state_grad,
            compiles_per_shape=d.compiles_per_shape,
            autotunes=d.autotunes,
            jit=d.jit,
            modes=d.modes,
            state_in_place=d.state_in_place,
            varlen=d.varlen,
        )(lazy(d.target))


def _kernel_packages() -> list[str]:
    """Every package under kernels/ (an op's folder, or external): where built-in impls are declared."""
    import pkgutil

    import deltabench.kernels as kernels

    return [f"{kernels.__name__}.{m.name}" for m in pkgutil.iter_modules(kernels.__path__) if m.ispkg]


def _source_of(fn: Callable[..., Any]) -> str:
    mod = getattr(fn, "__module__", "") or ""
    return "builtin" if mod.startswith("deltabench.") else mod


def lazy(target: str) -> Callable[..., Any]:
    """A callable that imports ``"package.module:function"`` on first call, so that listing impls
    never imports Triton or JAX and an interpreter flag set later still takes effect."""
    module, _, attr = target.partition(":")
    cache: list[Callable[..., Any]] = []

    def call(*args: Any, **kwargs: Any) -> Any:
        if not cache:
            cache.append(getattr(importlib.import_module(module), attr))
        return cache[0](*args, **kwargs)

    call.__name__ = attr
    call.__qualname__ = attr
    call.__module__ = module
    call.__doc__ = f"Lazily imported {target}."
    call.__deltabench_target__ = target  # type: ignore[attr-defined]
    return call


def load_module(spec: str) -> None:
    """Import a user's module (``pkg.mod``) or file (``path/to/impls.py``) that registers impls."""
    path = Path(spec)
    if spec.endswith(".py") or path.is_file():
        if not path.is_file():
            raise BadInput(f"--import {spec!r}: no such file")
        mod_name = f"deltabench_user_{abs(hash(str(path.resolve())))}"
        loader_spec = importlib.util.spec_from_file_location(mod_name, path)
        if loader_spec is None or loader_spec.loader is None:
            raise BadInput(f"--import {spec!r}: not a Python file")
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[mod_name] = module
        try:
            loader_spec.loader.exec_module(module)
        except Exception as exc:
            raise BadInput(f"--import {spec!r} failed: {type(exc).__name__}: {exc}") from exc
        return
    try:
        importlib.import_module(spec)
    except ImportError as exc:
        raise BadInput(f"--import {spec!r}: cannot import it ({exc})") from exc


def _load_all() -> None:
    """Register built-ins and entry-point impls once."""
    global _LOADED
    if _LOADED:
        return
    _LOADED = True
    for package in _kernel_packages():
        register_impls(getattr(importlib.import_module(package), "IMPLS", ()))
    load_entry_point_ops()
    for ep in entry_points(group="deltabench.impls"):
        try:
            obj = ep.load()
            if callable(obj) and not isinstance(obj, type(sys)):
                obj()
        except Exception as exc:  # a broken plugin must not hide the others
            print(f"deltabench: entry point {ep.name!r} failed to load: {exc}", file=sys.stderr)


def all_impls() -> list[Impl]:
    """Every registered impl, ordered by op then name."""
    _load_all()
    return [_REGISTRY[key] for key in sorted(_REGISTRY, key=lambda k: (list(OPS).index(k[0]), k[1]))]


def impls_for(op: str) -> list[Impl]:
    """The impls registered for `op`."""
    get_op(op)
    return [impl for impl in all_impls() if impl.op == op]


def get_impl(op: str, name: str) -> Impl:
    """Impl `name` of `op`, or UnknownImpl naming the registered ones."""
    get_op(op)
    _load_all()
    try:
        return _REGISTRY[(op, name)]
    except KeyError:
        known = ", ".join(i.name for i in impls_for(op)) or "none"
        raise UnknownImpl(f"unknown impl {name!r} for op {op!r}: registered impls are {known}") from None


def require_runnable(impl: Impl, case: Case) -> None:
    """Raise ImplUnavailable with the reason when `impl` cannot run `case`."""
    why = impl.check_case(case)
    if why:
        raise ImplUnavailable(f"{impl.op}/{impl.name}: {why}")
