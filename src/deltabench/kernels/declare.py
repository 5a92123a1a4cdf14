"""Impl declarations: what a kernel is, as plain data, written beside the kernel itself.

Each op package (``kernels/<op>/__init__.py``) and each adapter (``kernels/external/<pkg>.py``) exports ``IMPLS``, a
tuple of :class:`ImplDecl`; the harness's registry collects them (nothing here imports the harness). A constraint is
a function of the case (it reads ``case.K``, ``case.device`` ...) returning None when the impl can run it, else the
reason it cannot; it lives in the same module as the declaration.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

__all__ = ["ALL_DTYPES", "JAX_DEVICES", "JAX_DTYPES", "TORCH_DEVICES", "ImplDecl"]

ALL_DTYPES = ("fp32", "bf16", "fp16")
TORCH_DEVICES = ("cpu", "cuda")
JAX_DEVICES = ("cpu", "cuda", "tpu")
JAX_DTYPES = ("fp32", "bf16")


@dataclasses.dataclass(frozen=True)
class ImplDecl:
    """One impl of an op.

    Attributes:
        op, name: the op it implements and its name there (``gdn``, ``triton_chunk``).
        target: ``"package.module:function"``, imported on the first call (listing impls imports no kernel).
        backend: ``torch``, ``triton``, ``jax`` or ``cuda``.
        devices, dtypes: the platforms and dtypes it runs.
        backward: it has a backward (the gate checks gradients, ``fwd+bwd`` is timed).
        requires: importable modules it needs (checked without importing them).
        state_grad: its final state carries a gradient; False where a third-party op returns the state detached
            (the gate then back-propagates a cotangent on the output alone, and says so).
        constraint: ``constraint(case) -> str | None``, the reason it cannot run a case.
        compiles_per_shape: it compiles each new shape it is called at, for tens of seconds or more and without
            autotuning (TileLang, Pallas): a run gating jobs side by side (``--gate-workers``) gates each of its jobs
            in a process of its own, so that those compiles overlap, instead of one after another.
        autotunes: it picks launch configurations by timing them (``triton.autotune``): the gates of one tuning group
            (the same dims but B and T, and dtype) stay in one process, so that a configuration is tuned once and
            kept in Triton's cache for the timing, which then times the pick its gate checked. Different groups may
            gate side by side, as any impl's gates do beside other impls' (their picks are made on a shared device).
        jit: the JIT library its kernels build with, where a dry run can list them (``"tilelang"``,
            kernels/common/jit_units.FAMILIES): on a GPU a run builds each of those kernels once, side by side,
            before the impl's gates, instead of its gates building them one after another.
        varlen: it takes packed sequences, ``cu_seqlens=`` (FLA's convention: B = 1, int32 offsets [N + 1], the
            states [N, H, K, V]); an impl without it is refused at a packed case ("does not take cu_seqlens").
        notes: shown by ``deltabench list`` and stored with results.
        modes: the modes it runs (``("decode",)`` for a decode kernel); empty: every mode its backward allows
            (``fwd``, ``decode``, and ``fwd+bwd``, ``bwd`` with a backward).
        state_in_place: it writes the new state into the state buffer it is given (a decode kernel's cache
            update) and returns that buffer; the gate gives it a fresh copy each call and checks that buffer.
    """

    op: str
    name: str
    target: str
    backend: str
    devices: tuple[str, ...]
    dtypes: tuple[str, ...] = ALL_DTYPES
    backward: bool = True
    requires: tuple[str, ...] = ()
    constraint: Callable[[Any], str | None] | None = None
    state_grad: bool = True
    compiles_per_shape: bool = False
    autotunes: bool = False
    jit: str = ""
    varlen: bool = False
    notes: str = ""
    modes: tuple[str, ...] = ()
    state_in_place: bool = False
