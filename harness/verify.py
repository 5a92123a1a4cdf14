"""The verification engine: is an impl right for a case? Every check returns a CheckRecord.

For each seed (``case.seed, case.seed + 1, ...`` plus one drawn from ``os.urandom`` and recorded) and for both
variants, without and with a random initial state, :func:`verify_case`

- calls the impl on the op's seeded inputs (on ``case.device``, in ``case.dtype``) and checks the output contract
  (shapes, ``o`` in ``v``'s dtype) and that every output and gradient is finite;
- compares the output and the final state with the float64 oracle (run on the CPU, on the very same rounded
  inputs): relative Frobenius error (gating) and max abs error with the worst element's index (reported);
- when ``case.mode != "fwd"``, back-propagates random cotangents on ``o`` and on the final state through both and
  compares every gradient (q, k, v, each gate, initial_state) by name;
- streams: ``T1`` tokens, then the other ``T - T1`` from the returned state, must equal all ``T`` at once;

and finally calls the impl twice on identical inputs to report bitwise determinism (gating only when asked).

When the oracle is too costly at the case's shape (``reference="auto"``), the full-shape comparisons run against
the op's ``torch_chunk`` impl in fp32 on the case's device, and the oracle checks the impl at a shorter T.
Exceptions raised by the impl propagate (the runner turns them into statuses); a non-finite result is a failed
record, never an exception.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from typing import Any

import torch

from .cases import Case
from .checks import compare, finite_record, note_record
from .document import CheckRecord
from .errors import BadInput
from .ops import OpSpec, get_op
from .reference_cache import cached_reference
from .tolerances import threshold

__all__ = ["ORACLE_MAX_ELEMENTS", "ORACLE_MAX_ELEMENTS_GRAD", "SHORT_T", "VerifyReport", "split_point", "verify_case"]

# The oracle is a float64 token loop on the CPU: its cost is B*T*H*K*V element-steps (about 1 s per 1e8 on one
# core), and its autograd keeps a few [B,H,K,V] float64 tensors per token (about 3 GB at 1e8), so gradients get
# a lower limit than the forward.
ORACLE_MAX_ELEMENTS = 2e8
ORACLE_MAX_ELEMENTS_GRAD = 4e7
SHORT_T = 256  # the oracle's T when the full shape is too costly for it
_COTANGENT_SEED_OFFSET = 1_000_003  # cotangents are drawn from their own stream, not the inputs'


@dataclasses.dataclass
class VerifyReport:
    """The outcome of :func:`verify_case`: every record, the seeds used and what was compared against."""

    case: Case
    impl: str
    records: list[CheckRecord]
    seeds: list[int]
    drawn_seed: int | None
    reference: str

    @property
    def passed(self) -> bool:
        """True when every gating record passed."""
        return all(r.passed for r in self.records if r.gating)

    @property
    def failures(self) -> list[CheckRecord]:
        """The gating records that failed."""
        return [r for r in self.records if r.gating and not r.passed]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (non-finite values become null)."""
        return {
            "case": self.case.to_dict(),
            "impl": self.impl,
            "passed": self.passed,
            "seeds": list(self.seeds),
            "drawn_seed": self.drawn_seed,
            "reference": self.reference,
            "records": [json.loads(r.model_dump_json()) for r in self.records],
        }


@dataclasses.dataclass
class _Run:
    """One call's outputs and, when back-propagated, the gradient of every input by name."""

    o: torch.Tensor
    state: torch.Tensor | None
    grads: dict[str, torch.Tensor | None]

    def tensors(self) -> dict[str, torch.Tensor | None]:
        return {"o": self.o, "final_state": self.state, **{f"grad:{n}": g for n, g in self.grads.items()}}


def split_point(T: int) -> int | None:
    """Where the streaming check splits T tokens: near the middle, never on a multiple of 64 (so both halves
    hold a partial chunk); None when T == 1."""
    if T < 2:
        return None
    t1 = T // 2
    if t1 % 64 == 0:
        t1 -= 1
    return t1


def _draw_seed() -> int:
    return int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF


def _cotangents(case: Case, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random cotangents on o (in the case's dtype, as an upstream gradient would be) and on the state (float32)."""
    gen = torch.Generator(device="cpu").manual_seed(seed + _COTANGENT_SEED_OFFSET)
    do = torch.randn(case.B, case.T, case.H, case.V, generator=gen).to(case.torch_dtype)
    dht = torch.randn(case.B, case.H, case.K, case.V, generator=gen)
    return do, dht


def _call(
    fn: Callable[..., Any],
    spec: OpSpec,
    inputs: dict[str, torch.Tensor],
    cotangents: tuple[torch.Tensor, torch.Tensor] | None,
) -> _Run:
    """Call `fn` on fresh leaf copies of `inputs`; back-propagate `cotangents` when given."""
    want_grad = cotangents is not None
    leaves = {n: t.detach().clone().requires_grad_(want_grad) for n, t in inputs.items()}
    with torch.enable_grad() if want_grad else torch.no_grad():
        o, state = fn(*(leaves[n] for n in spec.args), scale=None, initial_state=leaves.get("initial_state"))
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
        names = list(leaves)
        values = torch.autograd.grad(outs, [leaves[n] for n in names], cots, allow_unused=True) if outs else []
        grads = dict(zip(names, values, strict=True)) if outs else dict.fromkeys(names)
    return _Run(o=o, state=state, grads=grads)


def _oracle_inputs(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {n: t.detach().to("cpu", torch.float64) for n, t in inputs.items()}


def _fp32_inputs(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {n: t.detach().float() for n, t in inputs.items()}


def _contract(run: _Run, case: Case, v_dtype: torch.dtype, **where: Any) -> list[CheckRecord]:
    """The output contract: o is a [B,T,H,V] tensor in v's dtype and the final state a [B,H,K,V] tensor."""
    problems = []
    o_shape, s_shape = [case.B, case.T, case.H, case.V], [case.B, case.H, case.K, case.V]
    if not isinstance(run.o, torch.Tensor) or list(run.o.shape) != o_shape:
        problems.append(f"o has shape {list(getattr(run.o, 'shape', []))}, expected {o_shape}")
    elif run.o.dtype != v_dtype:
        problems.append(f"o is {run.o.dtype}, expected v's dtype {v_dtype}")
    if not isinstance(run.state, torch.Tensor) or list(run.state.shape) != s_shape:
        problems.append(f"final state has shape {list(getattr(run.state, 'shape', []))}, expected {s_shape}")
    if problems:
        return [note_record("contract", "; ".join(problems), **where)]
    return []


def _compare_runs(
    run: _Run, ref: _Run, case: Case, *, seed: int, h0: bool, reference: str, grads: bool, profile: str = "native"
) -> list[CheckRecord]:
    """Output, final state and (when `grads`) every gradient of `run` against `ref`."""
    where = {"seed": seed, "regime": case.regime, "initial_state": h0, "reference": reference}
    records: list[CheckRecord] = []
    pairs: list[tuple[str, torch.Tensor | None, torch.Tensor | None]] = [
        ("output", run.o, ref.o),
        ("final_state", run.state, ref.state),
    ]
    if grads:
        pairs += [(f"grad:{n}", run.grads.get(n), g) for n, g in ref.grads.items()]
    for check, x, r in pairs:
        if r is None:
            continue
        if not isinstance(x, torch.Tensor):
            records.append(note_record(check, "the impl returned no value (no gradient reached this input)", **where))
            continue
        records += compare(check, x, r, threshold=threshold(case.dtype, check, profile=profile), **where)
    return records


def _split_the_impl_runs(fn: Callable[..., Any], case: Case, t1: int) -> tuple[int | None, str | None]:
    """`t1` when the impl runs both halves; else the split nearest the middle that it runs (an impl whose own
    constraint fixes T to a multiple of its chunk), or ``(None, its reason)`` when there is none."""
    check = getattr(fn, "check_case", None)
    if check is None:
        return t1, None
    first_reason = check(case.replace(T=t1)) or check(case.replace(T=case.T - t1))
    if first_reason is None:
        return t1, None
    for t in sorted(range(1, case.T), key=lambda t: (abs(2 * t - case.T), t)):
        if check(case.replace(T=t)) is None and check(case.replace(T=case.T - t)) is None:
            return t, None
    return None, first_reason


def _streaming(
    fn: Callable[..., Any],
    spec: OpSpec,
    case: Case,
    inputs: dict[str, torch.Tensor],
    whole: _Run,
    *,
    seed: int,
    h0: bool,
    profile: str = "native",
) -> list[CheckRecord]:
    """T1 tokens, then T - T1 from the returned state, against all T at once (the same impl)."""
    where = {"seed": seed, "regime": case.regime, "initial_state": h0}
    t1 = split_point(case.T)
    if t1 is None:
        return [note_record("streaming", "T=1: nothing to split", passed=True, gating=False, **where)]
    t1, refused = _split_the_impl_runs(fn, case, t1)
    if t1 is None:
        why = f"the impl runs no split of T={case.T} ({refused})"
        return [note_record("streaming", f"not checked: {why}", passed=True, gating=False, **where)]
    seq = {n: t for n, t in inputs.items() if n != "initial_state"}
    first = {n: t[:, :t1] for n, t in seq.items()}
    second = {n: t[:, t1:] for n, t in seq.items()}
    if "initial_state" in inputs:
        first["initial_state"] = inputs["initial_state"]
    head = _call(fn, spec, first, None)
    if not isinstance(head.state, torch.Tensor):
        return [note_record("streaming", "the impl returned no final state to continue from", **where)]
    second["initial_state"] = head.state.detach()
    tail = _call(fn, spec, second, None)
    reference = f"same impl, all T at once (split at T1={t1})"
    if not isinstance(tail.o, torch.Tensor) or not isinstance(head.o, torch.Tensor):
        return [note_record("streaming", "the impl returned no output", reference=reference, **where)]
    streamed_o = torch.cat([head.o, tail.o], dim=1)
    streamed = _Run(o=streamed_o, state=tail.state, grads={})
    records = [
        note_record("finite", f"streamed: {k} non-finite", reference="none", **where)
        for k, t in streamed.tensors().items()
        if isinstance(t, torch.Tensor) and not bool(torch.isfinite(t).all())
    ]
    at_once = _Run(o=whole.o.detach(), state=None if whole.state is None else whole.state.detach(), grads={})
    compared = _compare_runs(
        streamed, at_once, case, seed=seed, h0=h0, reference=reference, grads=False, profile=profile
    )
    for rec in compared:
        records.append(rec.model_copy(update={"check": f"streaming:{rec.check}"}))
    return records


def _determinism(first: _Run, second: _Run, *, gating: bool, seed: int, case: Case) -> CheckRecord:
    """Bitwise equality of two identical calls: value = the largest difference over every output and gradient."""
    a, b = first.tensors(), second.tensors()
    worst, differing = 0.0, []
    for name, x in a.items():
        y = b.get(name)
        if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
            continue
        if not torch.equal(x.detach(), y.detach()):
            differing.append(name)
            diff = (x.detach().double() - y.detach().double()).abs().nan_to_num(nan=float("inf"))
            worst = max(worst, float(diff.max().item()))
    return CheckRecord(
        check="determinism",
        metric="bitwise",
        value=worst,
        threshold=0.0,
        passed=not differing,
        gating=gating,
        seed=seed,
        regime=case.regime,
        initial_state=True,
        reference="same impl, second identical call",
        detail=("differs in " + ", ".join(differing)) if differing else "bitwise identical",
    )


def _cost(case: Case) -> float:
    return float(case.B) * case.T * case.H * case.K * case.V


def _short_case(case: Case, limit: float) -> Case:
    """The case cut down until the oracle can afford it: T to SHORT_T, then B to 1, then fewer heads."""
    short = case.replace(T=min(case.T, SHORT_T))
    if _cost(short) > limit:
        short = short.replace(B=1)
    if _cost(short) > limit:
        short = short.replace(H=max(1, int(limit // (short.T * short.K * short.V))))
    return short


def _chunk_reference(case: Case) -> Callable[..., Any]:
    from .registry import get_impl

    return get_impl(case.op, "torch_chunk")


def _shared_reference(case: Case, kind: str, grads: bool, compute: Callable[[], _Run]) -> _Run:
    """The reference run of `case`, shared through the on-disk cache (harness/reference_cache.py)."""
    tensors = cached_reference(case, kind=kind, grads=grads, compute=lambda: compute().tensors())
    grad_of = {n[len("grad:") :]: t for n, t in tensors.items() if n.startswith("grad:")}
    return _Run(o=tensors["o"], state=tensors["final_state"], grads=grad_of)


def _check_against(
    fn: Callable[..., Any],
    spec: OpSpec,
    case: Case,
    ref_kind: str,
    *,
    seed: int,
    h0: bool,
    grads: bool,
    reference_label: str,
    profile: str = "native",
) -> tuple[list[CheckRecord], _Run, dict[str, torch.Tensor]]:
    """Run the impl on the case's inputs at (seed, h0) and compare it with the oracle or the chunk reference."""
    sub = case.replace(seed=seed, initial_state=h0)
    inputs = spec.make_inputs(
        sub.B, sub.T, sub.H, sub.K, sub.V,
        dtype=sub.torch_dtype, device=sub.torch_device, seed=seed, regime=sub.regime, initial_state=h0,
    )  # fmt: skip
    cot = _cotangents(sub, seed) if grads else None
    run = _call(fn, spec, inputs, cot)
    where = {"seed": seed, "regime": case.regime, "initial_state": h0}
    records = _contract(run, sub, inputs["v"].dtype, **where)
    records.append(finite_record(run.tensors(), **where))
    if ref_kind == "oracle":
        ref_cot = None if cot is None else (cot[0].double(), cot[1].double())
        ref = _shared_reference(sub, ref_kind, grads, lambda: _call(spec.oracle, spec, _oracle_inputs(inputs), ref_cot))
    else:
        ref_cot = None if cot is None else (cot[0].float().to(case.torch_device), cot[1].to(case.torch_device))
        chunk = _chunk_reference(case)
        ref = _shared_reference(sub, ref_kind, grads, lambda: _call(chunk, spec, _fp32_inputs(inputs), ref_cot))
    records += _compare_runs(run, ref, sub, seed=seed, h0=h0, reference=reference_label, grads=grads, profile=profile)
    return records, run, inputs


def verify_case(
    impl: Callable[..., Any],
    case: Case,
    *,
    seeds: int = 3,
    extra_seed: bool = True,
    gate_determinism: bool = False,
    reference: str = "auto",
    oracle_max_elements: float | None = None,
) -> VerifyReport:
    """Verify `impl` (an Impl or any callable with the op's signature) on `case`; see the module docstring.

    Args:
        impl: the implementation under test.
        case: op, dims, dtype, seed (the first of `seeds` consecutive ones), regime, mode and device.
        seeds: how many consecutive seeds, from ``case.seed``.
        extra_seed: also draw one seed at run time (recorded in the report).
        gate_determinism: make the bitwise-determinism record gating.
        reference: ``"auto"``, ``"oracle"`` (always the float64 oracle) or ``"torch_chunk"`` (the chunked
            torch reference in fp32 at the full shape plus the oracle at a shorter T).
        oracle_max_elements: B*T*H*K*V above which ``"auto"`` leaves the oracle (default 2e8, 4e7 with gradients).

    Returns:
        A :class:`VerifyReport`; ``.passed`` is True when every gating record passed.
    """
    if seeds < 1 and not extra_seed:
        raise BadInput("verify needs at least one seed")
    spec = get_op(case.op)
    name = getattr(impl, "name", getattr(impl, "__name__", "impl"))
    grads = case.mode != "fwd" and getattr(impl, "supports_backward", True)
    limit = oracle_max_elements or (ORACLE_MAX_ELEMENTS_GRAD if grads else ORACLE_MAX_ELEMENTS)
    if reference not in ("auto", "oracle", "torch_chunk"):
        raise BadInput(f"unknown reference {reference!r}: use auto, oracle or torch_chunk")
    use_oracle = reference == "oracle" or (reference == "auto" and _cost(case) <= limit)
    drawn = _draw_seed() if extra_seed else None
    seed_list = [case.seed + i for i in range(max(seeds, 0))] + ([drawn] if drawn is not None else [])

    records: list[CheckRecord] = []
    if case.mode != "fwd" and not grads:
        records.append(note_record("gradients", "not checked: the impl is forward only", passed=True, gating=False))
    # Triton on the CPU runs in its interpreter, whose bf16 casts truncate: its own bf16 bound (tolerances.py).
    interpreted = getattr(impl, "backend", "") == "triton" and case.device == "cpu"
    profile = "triton_interpreter" if interpreted else "native"
    short = None if use_oracle else _short_case(case, limit)
    if use_oracle:
        sentence = "float64 oracle"
    else:
        sentence = f"torch_chunk in fp32 at full T, float64 oracle at {short.shape_id}"
    if interpreted and case.dtype == "bf16":
        sentence += " (bf16 bounds of the Triton interpreter, whose casts truncate)"
    first_run: tuple[_Run, dict[str, torch.Tensor]] | None = None
    for seed in seed_list:
        for h0 in (False, True):
            if use_oracle:
                recs, run, inputs = _check_against(
                    impl, spec, case, "oracle", seed=seed, h0=h0, grads=grads, reference_label="oracle", profile=profile
                )
            else:
                recs, run, inputs = _check_against(
                    impl, spec, case, "torch_chunk", seed=seed, h0=h0, grads=grads,
                    reference_label="torch_chunk_fp32", profile=profile,
                )  # fmt: skip
                short_recs, _, _ = _check_against(
                    impl, spec, short, "oracle", seed=seed, h0=h0, grads=grads,
                    reference_label=f"oracle at {short.shape_id}", profile=profile,
                )  # fmt: skip
                recs += short_recs
            records += recs
            records += _streaming(impl, spec, case, inputs, run, seed=seed, h0=h0, profile=profile)
            if first_run is None and h0:
                first_run = (run, inputs)
    if first_run is not None:
        run, inputs = first_run
        cot = _cotangents(case, seed_list[0]) if grads else None
        again = _call(impl, spec, inputs, cot)
        records.append(_determinism(run, again, gating=gate_determinism, seed=seed_list[0], case=case))
    return VerifyReport(case=case, impl=name, records=records, seeds=seed_list, drawn_seed=drawn, reference=sentence)
