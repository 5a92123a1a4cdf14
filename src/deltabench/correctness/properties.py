"""The properties a correctness gate checks, each as CheckRecords: closeness to a reference (every output, final
state and gradient against its tolerance), inputs left unchanged, streaming equal to all at once, bitwise
determinism (in this process and in a fresh one).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from deltabench.harness.cases import Case
from deltabench.harness.document import CheckRecord
from deltabench.harness.ops import OpSpec, get_op
from deltabench.harness.seqlens import cu_seqlens

from .calls import Item, Run, call_impl, call_options
from .checks import compare, note_record, rel_fro
from .plan import LARGEST_CHUNK, split_point, split_the_impl_runs
from .tolerances import threshold

__all__ = [
    "any_failed",
    "compare_items",
    "compare_runs",
    "determinism_record",
    "fresh_process_record",
    "streaming_records",
    "unchanged_record",
]


def compare_runs(
    run: Run,
    ref: Run,
    case: Case,
    *,
    seed: int,
    h0: bool,
    reference: str,
    grads: bool,
    profile: str = "native",
    family: str | None = None,
) -> list[CheckRecord]:
    """Output, final state and (when `grads`) every gradient of `run` against `ref`, each against the bound of
    its family at the case's dtype and regime and for its number of elements; `family` overrides the tolerance
    family of every check (the streaming checks)."""
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
        if case.seqlens is not None and tuple(x.shape) == tuple(r.shape) and _sequence_axis(check, case) is not None:
            records += _compare_by_sequence(check, x, r, case, family=family, profile=profile, where=where)
            continue
        # The bound of the regime the inputs were drawn in, and of the tensor's size (tolerances.py).
        bound = threshold(
            case.dtype,
            family or check,
            profile=profile,
            regime=case.regime,
            numel=r.numel(),
            op=case.op,
            dims=case.dims,
        )
        records += compare(check, x, r, threshold=bound, **where)
    return records


def _sequence_axis(check: str, case: Case) -> int | None:
    """Along which dim `check`'s tensor holds packed sequences: 1 (T) for the output and a sequence input's
    gradient, 0 (a row per sequence) for the final state and the initial state's gradient, None for the rest."""
    spec = get_op(case.op)
    if check in ("final_state", f"grad:{spec.state_arg}"):
        return 0
    if check == "output":
        return 1
    name = check.removeprefix("grad:")
    return 1 if check.startswith("grad:") and spec.arg(name).sequence else None


def _compare_by_sequence(
    check: str,
    x: torch.Tensor,
    r: torch.Tensor,
    case: Case,
    *,
    family: str | None,
    profile: str,
    where: dict[str, Any],
) -> list[CheckRecord]:
    """`x` against `r` one packed sequence at a time, each against the bound for its own size: the records of the
    sequence furthest over (or nearest to) its bound, naming it. A whole-tensor norm would let a short sequence's
    error drown in the long ones' (a length-1 sequence is 1/T of the output)."""
    axis = _sequence_axis(check, case)
    assert case.seqlens is not None and axis is not None
    bounds = cu_seqlens(case.seqlens) if axis == 1 else list(range(len(case.seqlens) + 1))
    worst: tuple[float, int] | None = None
    for i in range(len(bounds) - 1):
        xi, ri = (
            x.narrow(axis, bounds[i], bounds[i + 1] - bounds[i]),
            r.narrow(axis, bounds[i], bounds[i + 1] - bounds[i]),
        )
        bound = threshold(
            case.dtype,
            family or check,
            profile=profile,
            regime=case.regime,
            numel=ri.numel(),
            op=case.op,
            dims=case.dims,
        )
        ratio = rel_fro(xi, ri) / bound
        if worst is None or not ratio <= worst[0]:  # a NaN ratio is worst
            worst = (ratio, i)
    assert worst is not None
    i = worst[1]
    n = bounds[i + 1] - bounds[i]
    xi, ri = x.narrow(axis, bounds[i], n), r.narrow(axis, bounds[i], n)
    bound = threshold(
        case.dtype, family or check, profile=profile, regime=case.regime, numel=ri.numel(), op=case.op, dims=case.dims
    )
    out = []
    for rec in compare(check, xi, ri, threshold=bound, **where):
        index = list(rec.worst_index or [])
        if index:
            index[axis] += bounds[i]
        detail = f"worst of {len(case.seqlens)} sequences: sequence {i} (length {case.seqlens[i]})"
        out.append(
            rec.model_copy(update={"worst_index": index, "detail": "; ".join(x for x in (detail, rec.detail) if x)})
        )
    return out


def compare_items(
    items: list[Item], refs: list[Run], reference_label: str, *, grads: bool, profile: str
) -> list[CheckRecord]:
    """Every item's run against its reference run: its own records, then the comparisons."""
    records: list[CheckRecord] = []
    for it, ref in zip(items, refs, strict=True):
        label = ", ".join(x for x in (reference_label, it.variant.label()) if x)
        records += it.records
        records += compare_runs(
            it.run, ref, it.case, seed=it.seed, h0=it.variant.h0, reference=label, grads=grads, profile=profile
        )
    return records


def unchanged_record(runs: list[Run], *, reference: str = "the inputs before the call", **where: Any) -> CheckRecord:
    """Gating: no call wrote into an input tensor (value = how many input tensors changed)."""
    names = sorted({n for run in runs for n in run.mutated})
    detail = ("the impl wrote into its input " + ", ".join(names)) if names else "every input bitwise unchanged"
    return CheckRecord(
        check="inputs_unchanged",
        metric="changed_count",
        value=float(len(names)),
        threshold=0.0,
        passed=not names,
        reference=reference,
        detail=detail,
        **where,
    )


def streaming_records(
    fn: Callable[..., Any],
    spec: OpSpec,
    case: Case,
    inputs: dict[str, torch.Tensor],
    whole: Run,
    *,
    seed: int,
    h0: bool,
    profile: str = "native",
    t1: int | None = None,
    scale: float | None = None,
) -> tuple[list[CheckRecord], list[Run]]:
    """T1 tokens, then T - T1 from the returned state, against all T at once (the same impl). `t1` defaults to
    :func:`split_point` (inside a chunk); a split on a multiple of LARGEST_CHUNK is checked as ``boundary:*``
    against its own bound. Returns the records and the two calls (for the input check)."""
    where = {"seed": seed, "regime": case.regime, "initial_state": h0}
    t1 = split_point(case.T) if t1 is None else t1
    if t1 is None:
        return [note_record("streaming", "T=1: nothing to split", passed=True, gating=False, **where)], []
    t1, refused = split_the_impl_runs(fn, case, t1)
    if t1 is None:
        why = f"the impl runs no split of T={case.T} ({refused})"
        return [note_record("streaming", f"not checked: {why}", passed=True, gating=False, **where)], []
    on_boundary = t1 % LARGEST_CHUNK == 0
    prefix = "boundary" if on_boundary else "streaming"
    state_arg = spec.state_arg
    seq = {n: t for n, t in inputs.items() if n != state_arg and isinstance(t, torch.Tensor)}
    first = {n: t[:, :t1] if spec.arg(n).sequence else t for n, t in seq.items()}
    second = {n: t[:, t1:] if spec.arg(n).sequence else t for n, t in seq.items()}
    first.update(call_options(inputs))
    second.update(call_options(inputs))
    if state_arg in inputs:
        first[state_arg] = inputs[state_arg]
    head = call_impl(fn, spec, first, None, scale=scale)
    if not isinstance(head.state, torch.Tensor):
        return [note_record(prefix, "the impl returned no final state to continue from", **where)], [head]
    second[state_arg] = head.state.detach()
    tail = call_impl(fn, spec, second, None, scale=scale)
    where_ = "on a chunk boundary" if on_boundary else "inside a chunk"
    reference = f"same impl, all T={case.T} at once (split at T1={t1}, {where_})"
    if not isinstance(tail.o, torch.Tensor) or not isinstance(head.o, torch.Tensor):
        return [note_record(prefix, "the impl returned no output", reference=reference, **where)], [head, tail]
    streamed_o = torch.cat([head.o, tail.o], dim=1)
    streamed = Run(o=streamed_o, state=tail.state, grads={})
    records = [
        note_record("finite", f"streamed: {k} non-finite", reference="none", **where)
        for k, t in streamed.tensors().items()
        if isinstance(t, torch.Tensor) and not bool(torch.isfinite(t).all())
    ]
    at_once = Run(o=whole.o.detach(), state=None if whole.state is None else whole.state.detach(), grads={})
    compared = compare_runs(
        streamed, at_once, case, seed=seed, h0=h0, reference=reference, grads=False, profile=profile, family=prefix
    )
    for rec in compared:
        records.append(rec.model_copy(update={"check": f"{prefix}:{rec.check}"}))
    return records, [head, tail]


def determinism_record(
    first: Run,
    second: dict[str, torch.Tensor | None],
    *,
    gating: bool,
    seed: int,
    regime: str,
    check: str = "determinism",
    reference: str = "same impl, second identical call",
) -> CheckRecord:
    """Bitwise equality of two identical calls (drawn in `regime`; `second` as ``Run.tensors()``): value = the
    largest difference over every output and gradient. An output or gradient present in one call only differs."""
    a, b = first.tensors(), second
    worst, differing = 0.0, []
    for name, x in a.items():
        y = b.get(name)
        if not isinstance(x, torch.Tensor) and not isinstance(y, torch.Tensor):
            continue
        if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor) or x.shape != y.shape:
            differing.append(name)
            worst = float("inf")
            continue
        # On the first call's device: no copy of every output and gradient to the host (a fresh process's come
        # back on the host).
        x, y = x.detach(), y.detach().to(x.device)
        if not torch.equal(x, y):
            differing.append(name)
            diff = (x.double() - y.double()).abs().nan_to_num(nan=float("inf"))
            worst = max(worst, float(diff.max().item()))
    return CheckRecord(
        check=check,
        metric="bitwise",
        value=worst,
        threshold=0.0,
        passed=not differing,
        gating=gating,
        seed=seed,
        regime=regime,
        initial_state=True,
        reference=reference,
        detail=("differs in " + ", ".join(differing)) if differing else "bitwise identical",
    )


def fresh_process_record(
    impl: Callable[..., Any], case: Case, first: Item, imports: list[str] | tuple[str, ...], **where: Any
) -> CheckRecord:
    """`first`'s call replayed in a fresh interpreter (correctness/fresh_process.py), bitwise against `first`; a plain
    callable (no registered name to find it by) gets a non-gating note instead."""
    from .fresh_process import ReplayFailed, replay_in_fresh_process

    check = "determinism:process"
    op, name = getattr(impl, "op", None), getattr(impl, "name", None)
    if not (isinstance(op, str) and isinstance(name, str)):
        why = "not checked: the impl is not a registered impl, which a fresh process would find by name"
        return note_record(check, why, passed=True, gating=False, seed=where["seed"], regime=where["regime"])
    spec = get_op(case.op)
    try:
        tensors = replay_in_fresh_process(
            op,
            name,
            first.inputs,
            first.cot,
            scale=first.variant.scale(spec, case.dims),
            device=case.device,
            imports=imports,
        )
    except ReplayFailed as exc:
        return note_record(check, str(exc), gating=where["gating"], seed=where["seed"], regime=where["regime"])
    return determinism_record(
        first.run, tensors, check=check, reference="same impl, same call in a fresh process", **where
    )


def any_failed(records: list[CheckRecord]) -> bool:
    """Whether any gating record of `records` failed."""
    return any(r.gating and not r.passed for r in records)
