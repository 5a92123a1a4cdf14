"""The calls: an impl called on a case's drawn inputs, its outputs and gradients read back as a :class:`Run`.

Every call gets fresh leaf copies of the inputs (compared with them afterwards, bit for bit), random cotangents
drawn from their own stream, and the contract's options; :func:`run_impl` adds the output-contract and
finiteness records of one (seed, :class:`Variant`) run. The bottom of the correctness gate: it imports none of
the modules above it.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

import torch

from deltabench.harness.cases import Case
from deltabench.harness.document import CheckRecord
from deltabench.harness.ops import OpSpec, make_case_inputs
from deltabench.references._inputs import generator, randn
from deltabench.references.contract import CU_SEQLENS

from .checks import finite_record, note_record

__all__ = [
    "ALT_SCALE",
    "Item",
    "Run",
    "Variant",
    "call_impl",
    "call_kwargs",
    "call_options",
    "contract_records",
    "draw_cotangents",
    "draw_seed",
    "fp32_inputs",
    "is_differentiable",
    "is_unchanged",
    "run_impl",
]


# The non-default scale, as a multiple of the default K**-0.5: far from 1 (a kernel ignoring `scale` is off by
# 1/0.6 - 1 = 67%), and not a power of two, so that a kernel using it in one place but K**-0.5 in another is wrong.
ALT_SCALE = 0.6


_COTANGENT_SEED_OFFSET = 1_000_003  # cotangents are drawn from their own stream, not the inputs'


@dataclasses.dataclass
class Run:
    """One call's outputs, when back-propagated the gradient of every input by name, and the inputs it wrote into."""

    o: torch.Tensor
    state: torch.Tensor | None
    grads: dict[str, torch.Tensor | None]
    mutated: list[str] = dataclasses.field(default_factory=list)

    def tensors(self) -> dict[str, torch.Tensor | None]:
        return {"o": self.o, "final_state": self.state, **{f"grad:{n}": g for n, g in self.grads.items()}}


@dataclasses.dataclass(frozen=True)
class Variant:
    """How one run's inputs and arguments are drawn: regime, initial state, scale factor, unit-norm q and k."""

    regime: str
    h0: bool
    scale_factor: float | None = None  # None: scale=None (the default K**-0.5); else this times K**-0.5
    unit_qk: bool = True

    def scale(self, spec: OpSpec, dims: dict[str, int]) -> float | None:
        default = spec.default_scale(dims)
        return None if self.scale_factor is None or default is None else self.scale_factor * default

    def label(self) -> str:
        """The run's arguments where they differ from the defaults, for the record's reference."""
        parts = [] if self.scale_factor is None else [f"scale={self.scale_factor:g}/sqrt(K)"]
        return ", ".join(parts + ([] if self.unit_qk else ["q, k not unit-norm"]))


def draw_seed() -> int:
    """A fresh random seed for the gate (from ``os.urandom``, in [0, 2**31))."""
    return int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF


def draw_cotangents(spec: OpSpec, case: Case, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random cotangents on the output (in the case's dtype, as an upstream gradient would be) and on the state
    (float32), in the contract's shapes, drawn where the case's inputs are (references/_inputs.py)."""
    gen = generator(seed + _COTANGENT_SEED_OFFSET, case.torch_device)
    do = randn(gen, *spec.output.shape(case.dims)).to(case.torch_dtype)
    dht = randn(gen, *spec.state.shape(case.state_dims))
    return do, dht


def is_differentiable(spec: OpSpec, name: str, t: torch.Tensor) -> bool:
    """An input the gradients are taken for: a float tensor the contract gives a gradient (never an index)."""
    return t.is_floating_point() and spec.arg(name).differentiable


def call_options(inputs: dict[str, Any]) -> dict[str, Any]:
    """What ``make_inputs`` returned beside the tensors (the contract's options, e.g. sdm's ``num_slots``): passed to
    every call as keyword arguments, as they are."""
    return {n: x for n, x in inputs.items() if not isinstance(x, torch.Tensor)}


def call_kwargs(spec: OpSpec, scale: float | None, state: torch.Tensor | None) -> dict[str, Any]:
    """The keyword arguments of one call: ``scale`` where the op takes one, and the initial state."""
    return {**({"scale": scale} if spec.scale is not None else {}), spec.state_arg: state}


def call_impl(
    fn: Callable[..., Any],
    spec: OpSpec,
    inputs: dict[str, torch.Tensor],
    cotangents: tuple[torch.Tensor, torch.Tensor] | None,
    *,
    scale: float | None = None,
) -> Run:
    """Call `fn` on fresh leaf copies of `inputs`; back-propagate `cotangents` when given. `inputs` themselves are
    never handed out: the copies are compared with them afterwards, bit for bit, and any that changed is named in
    ``mutated``; but for an impl declared ``state_in_place``, whose final state is read from the state buffer it was
    given (an impl that did not write it back then fails against the reference)."""
    want_grad = cotangents is not None
    leaves = {
        n: t.detach().clone().requires_grad_(want_grad and is_differentiable(spec, n, t))
        for n, t in inputs.items()
        if isinstance(t, torch.Tensor)
    }
    options = call_options(inputs)
    # packed sequences: their offsets passed by keyword, as FLA's kernels take them (a copy, checked like the rest)
    packed = {CU_SEQLENS: leaves[CU_SEQLENS]} if CU_SEQLENS in leaves else {}
    with torch.enable_grad() if want_grad else torch.no_grad():
        o, state = fn(
            *(leaves[n] for n in spec.args),
            **call_kwargs(spec, scale, leaves.get(spec.state_arg)),
            **packed,
            **options,
        )
    grads: dict[str, torch.Tensor | None] = {}
    if want_grad:
        do, dht = cotangents
        outs, cots = [], []
        # An output of the wrong shape is left out here; the contract check reports it.
        if isinstance(o, torch.Tensor) and o.requires_grad and o.shape == do.shape:
            outs.append(o)
            cots.append(do.to(o.device, o.dtype))
        if isinstance(state, torch.Tensor) and state.requires_grad and state.shape == dht.shape:
            outs.append(state)
            cots.append(dht.to(state.device, state.dtype))
        names = [n for n, t in leaves.items() if t.requires_grad]
        values = torch.autograd.grad(outs, [leaves[n] for n in names], cots, allow_unused=True) if outs else []
        grads = dict(zip(names, values, strict=True)) if outs else dict.fromkeys(names)
    in_place = spec.state_arg if getattr(fn, "state_in_place", False) and spec.state_arg in leaves else None
    if in_place is not None:
        # The impl declares that it writes the new state into the buffer it was given (a fresh copy, as every
        # input is): that buffer is its final state, whatever it returned.
        state = leaves[in_place].detach()
    mutated = [n for n, t in leaves.items() if n != in_place and not is_unchanged(t.detach(), inputs[n].detach())]
    return Run(o=o, state=state, grads=grads, mutated=mutated)


def is_unchanged(after: torch.Tensor, before: torch.Tensor) -> bool:
    """Same shape and values, NaN where there was NaN (a non-finite state streamed back in is no write)."""
    if after.shape != before.shape or after.dtype != before.dtype:
        return False
    if after.is_floating_point():
        nan = before.isnan()
        return torch.equal(after.isnan(), nan) and torch.equal(after.masked_fill(nan, 0), before.masked_fill(nan, 0))
    return torch.equal(after, before)


def fp32_inputs(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {
        n: (t.detach().float() if t.is_floating_point() else t.detach()) if isinstance(t, torch.Tensor) else t
        for n, t in inputs.items()
    }


def contract_records(run: Run, spec: OpSpec, case: Case, **where: Any) -> list[CheckRecord]:
    """The output contract: the output and the final state have the contract's shapes (the delta family's o
    [B,T,H,V] in the case's dtype, state [B,H,K,V], [N,H,K,V] for N packed sequences), the output in the case's
    dtype (float32 where it says so)."""
    problems = []
    o_shape, s_shape = list(spec.output.shape(case.dims)), list(spec.state.shape(case.state_dims))
    o_dtype = torch.float32 if spec.output.dtype == "float32" else case.torch_dtype
    name = spec.output.name
    if not isinstance(run.o, torch.Tensor) or list(run.o.shape) != o_shape:
        problems.append(f"{name} has shape {list(getattr(run.o, 'shape', []))}, expected {o_shape}")
    elif run.o.dtype != o_dtype:
        problems.append(f"{name} is {run.o.dtype}, expected the case's dtype {o_dtype}")
    if not isinstance(run.state, torch.Tensor) or list(run.state.shape) != s_shape:
        problems.append(f"final state has shape {list(getattr(run.state, 'shape', []))}, expected {s_shape}")
    if problems:
        return [note_record("contract", "; ".join(problems), **where)]
    return []


@dataclasses.dataclass
class Item:
    """One run of the impl: its case (regime and h0 set), variant, inputs, cotangents, result and records."""

    case: Case
    variant: Variant
    seed: int
    inputs: dict[str, torch.Tensor]
    cot: tuple[torch.Tensor, torch.Tensor] | None
    run: Run
    records: list[CheckRecord]


def run_impl(fn: Callable[..., Any], spec: OpSpec, case: Case, variant: Variant, *, seed: int, grads: bool) -> Item:
    """Call the impl on the case's inputs at (seed, variant): the contract and finiteness records."""
    h0 = variant.h0
    sub = case.replace(seed=seed, initial_state=h0, regime=variant.regime)
    inputs = make_case_inputs(spec, sub, unit_qk=variant.unit_qk)
    cot = draw_cotangents(spec, sub, seed) if grads else None
    if cot is not None and not getattr(fn, "state_grad", True):
        cot = (cot[0], torch.zeros_like(cot[1]))
    run = call_impl(fn, spec, inputs, cot, scale=variant.scale(spec, sub.dims))
    where = {"seed": seed, "regime": sub.regime, "initial_state": h0}
    records = contract_records(run, spec, sub, **where)
    records.append(finite_record(run.tensors(), **where))
    return Item(sub, variant, seed, inputs, cot, run, records)
