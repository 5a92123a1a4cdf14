"""The verification engine: is an impl right for a case? Every check returns a CheckRecord.

For each seed (``case.seed, case.seed + 1, ...`` plus one drawn from ``os.urandom`` and recorded), each gate
regime (``typical``, ``long`` and ``strong`` unless narrowed) and both variants, without and with a random initial
state, :func:`verify_case`

- calls the impl on the op's seeded inputs (on ``case.device``, in ``case.dtype``) and checks the output contract
  (shapes, ``o`` in ``v``'s dtype), that every output and gradient is finite, and that every input tensor is
  bitwise unchanged after the call (the failure names the tensor). The runs with an initial state pass a
  non-default ``scale`` (:data:`ALT_SCALE` times ``K ** -0.5``, the oracle given the same); the run without one
  in the last regime draws q and k with random norms instead of unit vectors;
- compares the output and the final state with the float64 oracle (on the very same rounded inputs; run on the
  case's GPU for a CUDA case, else on the CPU: :func:`oracle_device`): relative Frobenius error (gating) and max
  abs error with the worst element's index (reported);
- when ``case.mode != "fwd"``, back-propagates random cotangents on ``o`` and on the final state through both and
  compares every gradient (q, k, v, each gate, initial_state) by name;
- streams: ``T1`` tokens, then the other ``T - T1`` from the returned state, must equal all ``T`` at once;

then sweeps lengths at the first seed (B = 1, the case's other dims, long regime, with an initial state): T rounded
to a multiple of :data:`LARGEST_CHUNK` (two to four chunks, as many as the oracle affords) streamed with its split
on a chunk boundary, a T inside one chunk streamed with its split inside it, and T = 1. A split on a chunk
boundary makes a chunked kernel do the same arithmetic streamed and at once, but for the state carried across that
boundary; its bound (``boundary`` in tolerances.py) is far below the oracle's at bf16, which is what catches a
forward-only bf16 kernel carrying its state wrongly. Finally it calls the impl twice on identical inputs to report
bitwise determinism (gating when asked, or when the op's contract demands it), and where asked
(``fresh_process``: the CLI and the runner do whenever determinism gates) replays the first of those calls in a
fresh interpreter (harness/fresh_process.py) and holds it to the same bits (``determinism:process``).

An impl declared ``state_grad=False`` (a third-party op returning its final state detached) is back-propagated with
a zero cotangent on the final state, and so is its reference: its gradients are those of the output alone.

When the oracle is too costly at the case's shape (``reference="auto"``), the full-shape comparisons run against
the op's ``torch_chunk`` impl in fp32 on the case's device, and the oracle checks the impl at a reduced case: B = 1,
T as the sweep's longest length (at most :data:`SHORT_T`, two chunks at least), fewer heads only when the oracle
cannot afford even that. Where the reference's backward at the full shape would not fit in the device memory
(sdm's flagship: about 220 GiB at T = 8192; measured and extrapolated, or ``grad_reference_T``), the full shape
compares the output and the final state with its forward alone, and every (seed, variant) is also run, gradients
included, at the longest T that fits, against the reference there (the records and the report's reference say so);
the oracle's reduced case keeps checking gradients in every regime.

The reduced cases (the oracle's and the length sweep's) keep every dim of the case but B and T: a kernel compiled or
autotuned per head count (a Triton ``constexpr``, an autotuner's key) meets one head count per case, and their
records depend on the impl, op, dtype, mode, those dims, seeds and regimes alone. Given a
:class:`~.gate_memo.GateMemo` (a worker process running many jobs of one impl in a run), ``verify_case`` makes them
once per run and reuses them, marked as reused, in later jobs (harness/gate_memo.py).
Exceptions raised by the impl propagate (the runner turns them into statuses); a non-finite result is a failed
record, never an exception.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from deltabench.references._inputs import draw_device, draw_origin, generator, randn

from .cases import Case
from .checks import compare, finite_record, note_record
from .devices import allocator_fraction, device_share
from .document import CheckRecord
from .errors import BadInput
from .gate_memo import GateMemo
from .ops import OpSpec, get_op, make_case_inputs
from .reference_cache import cached_reference
from .tolerances import threshold

__all__ = [
    "ALT_SCALE",
    "GRAD_REFERENCE_MEMORY_SHARE",
    "LARGEST_CHUNK",
    "ORACLE_MAX_ELEMENTS",
    "ORACLE_MAX_ELEMENTS_GRAD",
    "SHORT_T",
    "SWEEP_B",
    "VerifyReport",
    "draw_seed",
    "fitting_T",
    "gate_shapes",
    "oracle_device",
    "split_point",
    "sweep_lengths",
    "verify_case",
    "warm_calls",
]

# The oracle is a float64 token loop: its cost is B*T*H*K*V element-steps (about 1 s per 1e8 on one CPU core; on
# a GPU, kernel launches, a few per token), and its autograd keeps a few [B,H,K,V] float64 tensors per token (about
# 3 GB at 1e8), so gradients get a lower limit than the forward. The limits are the CPU's, kept for a GPU case too
# so that the reduced case and its records do not depend on where the oracle runs.
ORACLE_MAX_ELEMENTS = 2e8
ORACLE_MAX_ELEMENTS_GRAD = 4e7
SHORT_T = 256  # the oracle's T when the full shape is too costly for it
_COTANGENT_SEED_OFFSET = 1_000_003  # cotangents are drawn from their own stream, not the inputs'
# The non-default scale, as a multiple of the default K**-0.5: far from 1 (a kernel ignoring `scale` is off by
# 1/0.6 - 1 = 67%), and not a power of two, so that a kernel using it in one place but K**-0.5 in another is wrong.
ALT_SCALE = 0.6
# The largest chunk any shipped kernel uses: 64 in kernels/gdn/triton (wy.CHUNK), kernels/gdn2/jax/jax_chunk (CHUNK) and
# the torch_chunk impls (chunk_size); FLA's chunked kernels use 64 too.
LARGEST_CHUNK = 64
SWEEP_B = 1  # the length sweep's batch; its other dims are the case's (module docstring)
# The share of the device memory free at the decision that the chunked reference's backward may take (the impl's
# and the reference's full-shape runs, the allocator's slack and the extrapolation's error take the rest).
GRAD_REFERENCE_MEMORY_SHARE = 0.5


@dataclasses.dataclass
class VerifyReport:
    """The outcome of :func:`verify_case`: every record, the seeds used and what was compared against."""

    case: Case
    impl: str
    records: list[CheckRecord]
    seeds: list[int]
    drawn_seed: int | None
    reference: str
    stage_s: dict[str, float] = dataclasses.field(default_factory=dict)  # seconds in each stage of the gate

    @property
    def time_record(self) -> CheckRecord:
        """``gate time``, a non-gating note: the gate's seconds, then each stage's, the longest first (where a gate
        that takes minutes at a large shape spends them). Not among :attr:`records`, which two identical gates
        reproduce exactly."""
        stages = sorted(self.stage_s.items(), key=lambda kv: -kv[1])
        detail = f"{sum(self.stage_s.values()):.1f} s: " + ", ".join(f"{k} {v:.1f} s" for k, v in stages)
        return note_record("gate time", detail, passed=True, gating=False)

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
            "stage_s": dict(self.stage_s),
        }


class _StageClock:
    """Seconds spent in each stage of a gate: ``with clock(stage):`` adds the block's time to `stage`."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, stage: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[stage] = self.seconds.get(stage, 0.0) + time.perf_counter() - t0


@dataclasses.dataclass
class _Run:
    """One call's outputs, when back-propagated the gradient of every input by name, and the inputs it wrote into."""

    o: torch.Tensor
    state: torch.Tensor | None
    grads: dict[str, torch.Tensor | None]
    mutated: list[str] = dataclasses.field(default_factory=list)

    def tensors(self) -> dict[str, torch.Tensor | None]:
        return {"o": self.o, "final_state": self.state, **{f"grad:{n}": g for n, g in self.grads.items()}}


@dataclasses.dataclass(frozen=True)
class _Variant:
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


def split_point(T: int) -> int | None:
    """Where the streaming check splits T tokens: near the middle, never on a multiple of 64 (so both halves
    hold a partial chunk); None when T == 1."""
    if T < 2:
        return None
    t1 = T // 2
    if t1 % LARGEST_CHUNK == 0:
        t1 -= 1
    return t1


def sweep_lengths(T: int, max_chunks: int = SHORT_T // LARGEST_CHUNK) -> list[tuple[int, int | None]]:
    """The length sweep's (T, streaming split) pairs for a case of length `T`.

    T rounded to a multiple of :data:`LARGEST_CHUNK` (at least two chunks, so that a boundary lies inside, and at
    most `max_chunks`, by default those of ``SHORT_T``, so that the oracle stays cheap) split on a chunk boundary;
    one chunk exactly, split in its middle; T = 1 (nothing to split). The lengths reuse one another's shapes (the
    boundary split's halves are one chunk long): a compiling impl (JAX, Triton) compiles few new programs.
    """
    C = LARGEST_CHUNK
    chunks = max(min(round(T / C), max_chunks), 2)
    return [(chunks * C, C * (chunks // 2)), (C, C // 2), (1, None)]


def draw_seed() -> int:
    """A fresh random seed for the gate (from ``os.urandom``, in [0, 2**31))."""
    return int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF


def oracle_device(case: Case) -> torch.device:
    """Where the float64 oracle runs for `case`: its GPU for a CUDA case (IEEE float64 there too, without the
    host's token loop and the inputs' copies to the host), else the CPU."""
    return draw_device(case.torch_device)


def _cotangents(spec: OpSpec, case: Case, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random cotangents on the output (in the case's dtype, as an upstream gradient would be) and on the state
    (float32), in the contract's shapes, drawn where the case's inputs are (references/_inputs.py)."""
    gen = generator(seed + _COTANGENT_SEED_OFFSET, case.torch_device)
    do = randn(gen, *spec.output.shape(case.dims)).to(case.torch_dtype)
    dht = randn(gen, *spec.state.shape(case.dims))
    return do, dht


def _differentiable(spec: OpSpec, name: str, t: torch.Tensor) -> bool:
    """An input the gradients are taken for: a float tensor the contract gives a gradient (never an index)."""
    return t.is_floating_point() and spec.arg(name).differentiable


def _options(inputs: dict[str, Any]) -> dict[str, Any]:
    """What ``make_inputs`` returned beside the tensors (the contract's options, e.g. sdm's ``num_slots``): passed to
    every call as keyword arguments, as they are."""
    return {n: x for n, x in inputs.items() if not isinstance(x, torch.Tensor)}


def _kwargs(spec: OpSpec, scale: float | None, state: torch.Tensor | None) -> dict[str, Any]:
    """The keyword arguments of one call: ``scale`` where the op takes one, and the initial state."""
    return {**({"scale": scale} if spec.scale is not None else {}), spec.state_arg: state}


def _call(
    fn: Callable[..., Any],
    spec: OpSpec,
    inputs: dict[str, torch.Tensor],
    cotangents: tuple[torch.Tensor, torch.Tensor] | None,
    *,
    scale: float | None = None,
) -> _Run:
    """Call `fn` on fresh leaf copies of `inputs`; back-propagate `cotangents` when given. `inputs` themselves are
    never handed out: the copies are compared with them afterwards, bit for bit, and any that changed is named in
    ``mutated``."""
    want_grad = cotangents is not None
    leaves = {
        n: t.detach().clone().requires_grad_(want_grad and _differentiable(spec, n, t))
        for n, t in inputs.items()
        if isinstance(t, torch.Tensor)
    }
    options = _options(inputs)
    with torch.enable_grad() if want_grad else torch.no_grad():
        o, state = fn(*(leaves[n] for n in spec.args), **_kwargs(spec, scale, leaves.get(spec.state_arg)), **options)
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
    mutated = [n for n, t in leaves.items() if not _unchanged(t.detach(), inputs[n].detach())]
    return _Run(o=o, state=state, grads=grads, mutated=mutated)


def _unchanged(after: torch.Tensor, before: torch.Tensor) -> bool:
    """Same shape and values, NaN where there was NaN (a non-finite state streamed back in is no write)."""
    if after.shape != before.shape or after.dtype != before.dtype:
        return False
    if after.is_floating_point():
        nan = before.isnan()
        return torch.equal(after.isnan(), nan) and torch.equal(after.masked_fill(nan, 0), before.masked_fill(nan, 0))
    return torch.equal(after, before)


def _unchanged_record(runs: list[_Run], *, reference: str = "the inputs before the call", **where: Any) -> CheckRecord:
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


def _fp32_inputs(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {
        n: (t.detach().float() if t.is_floating_point() else t.detach()) if isinstance(t, torch.Tensor) else t
        for n, t in inputs.items()
    }


def _contract(run: _Run, spec: OpSpec, case: Case, **where: Any) -> list[CheckRecord]:
    """The output contract: the output and the final state have the contract's shapes (the delta family's o
    [B,T,H,V] in the case's dtype, state [B,H,K,V]), the output in the case's dtype (float32 where it says so)."""
    problems = []
    o_shape, s_shape = list(spec.output.shape(case.dims)), list(spec.state.shape(case.dims))
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


def _compare_runs(
    run: _Run,
    ref: _Run,
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
        # The bound of the regime the inputs were drawn in, and of the tensor's size (tolerances.py).
        bound = threshold(case.dtype, family or check, profile=profile, regime=case.regime, numel=r.numel())
        records += compare(check, x, r, threshold=bound, **where)
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
    t1: int | None = None,
    scale: float | None = None,
) -> tuple[list[CheckRecord], list[_Run]]:
    """T1 tokens, then T - T1 from the returned state, against all T at once (the same impl). `t1` defaults to
    :func:`split_point` (inside a chunk); a split on a multiple of LARGEST_CHUNK is checked as ``boundary:*``
    against its own bound. Returns the records and the two calls (for the input check)."""
    where = {"seed": seed, "regime": case.regime, "initial_state": h0}
    t1 = split_point(case.T) if t1 is None else t1
    if t1 is None:
        return [note_record("streaming", "T=1: nothing to split", passed=True, gating=False, **where)], []
    t1, refused = _split_the_impl_runs(fn, case, t1)
    if t1 is None:
        why = f"the impl runs no split of T={case.T} ({refused})"
        return [note_record("streaming", f"not checked: {why}", passed=True, gating=False, **where)], []
    on_boundary = t1 % LARGEST_CHUNK == 0
    prefix = "boundary" if on_boundary else "streaming"
    state_arg = spec.state_arg
    seq = {n: t for n, t in inputs.items() if n != state_arg and isinstance(t, torch.Tensor)}
    first = {n: t[:, :t1] if spec.arg(n).sequence else t for n, t in seq.items()}
    second = {n: t[:, t1:] if spec.arg(n).sequence else t for n, t in seq.items()}
    first.update(_options(inputs))
    second.update(_options(inputs))
    if state_arg in inputs:
        first[state_arg] = inputs[state_arg]
    head = _call(fn, spec, first, None, scale=scale)
    if not isinstance(head.state, torch.Tensor):
        return [note_record(prefix, "the impl returned no final state to continue from", **where)], [head]
    second[state_arg] = head.state.detach()
    tail = _call(fn, spec, second, None, scale=scale)
    where_ = "on a chunk boundary" if on_boundary else "inside a chunk"
    reference = f"same impl, all T={case.T} at once (split at T1={t1}, {where_})"
    if not isinstance(tail.o, torch.Tensor) or not isinstance(head.o, torch.Tensor):
        return [note_record(prefix, "the impl returned no output", reference=reference, **where)], [head, tail]
    streamed_o = torch.cat([head.o, tail.o], dim=1)
    streamed = _Run(o=streamed_o, state=tail.state, grads={})
    records = [
        note_record("finite", f"streamed: {k} non-finite", reference="none", **where)
        for k, t in streamed.tensors().items()
        if isinstance(t, torch.Tensor) and not bool(torch.isfinite(t).all())
    ]
    at_once = _Run(o=whole.o.detach(), state=None if whole.state is None else whole.state.detach(), grads={})
    compared = _compare_runs(
        streamed, at_once, case, seed=seed, h0=h0, reference=reference, grads=False, profile=profile, family=prefix
    )
    for rec in compared:
        records.append(rec.model_copy(update={"check": f"{prefix}:{rec.check}"}))
    return records, [head, tail]


def _determinism(
    first: _Run,
    second: dict[str, torch.Tensor | None],
    *,
    gating: bool,
    seed: int,
    regime: str,
    check: str = "determinism",
    reference: str = "same impl, second identical call",
) -> CheckRecord:
    """Bitwise equality of two identical calls (drawn in `regime`; `second` as ``_Run.tensors()``): value = the
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


def _fresh_process_determinism(
    impl: Callable[..., Any], case: Case, first: _Item, imports: list[str] | tuple[str, ...], **where: Any
) -> CheckRecord:
    """`first`'s call replayed in a fresh interpreter (harness/fresh_process.py), bitwise against `first`; a plain
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
    return _determinism(first.run, tensors, check=check, reference="same impl, same call in a fresh process", **where)


def _cost(case: Case) -> float:
    return get_op(case.op).cost(case.dims)


def _short_case(case: Case, limit: float) -> Case:
    """The case cut down until the oracle can afford it: B to 1 (where the op has a B) and T to the sweep's longest
    length (:func:`_sweep_chunks`), then the contract's rule (the delta family's heads, when even two chunks are
    too costly). B and T go first, affordable or not, so that the reduced case is the same for every B and T of the
    job's other dims and its head count the job's wherever the oracle allows (module docstring)."""
    dims = {**case.dims, **({"B": SWEEP_B} if "B" in case.dims else {})}
    short_t = min(case.T, sweep_lengths(case.T, _sweep_chunks(case, limit))[0][0])
    return case.replace(**get_op(case.op).shrink(dims, limit, short_t))


def _sweep_chunks(case: Case, limit: float) -> int:
    """How many chunks the sweep's longest length may hold: the most, up to ``SHORT_T``, whose oracle run (B = 1,
    the case's other dims) stays within `limit`; two at least, so that a chunk boundary lies inside."""
    spec = get_op(case.op)
    for n in range(SHORT_T // LARGEST_CHUNK, 2, -1):
        dims = {**case.dims, **({"B": SWEEP_B} if "B" in case.dims else {}), "T": n * LARGEST_CHUNK}
        if spec.cost(dims) <= limit:
            return n
    return 2


def fitting_T(T: int, need_a: float, need_b: float, t_a: int, t_b: int, budget: float) -> int:
    """The longest T (`T` itself, else a multiple of :data:`LARGEST_CHUNK`, two chunks at least) whose need, the
    line through ``(t_a, need_a)`` and ``(t_b, need_b)`` (bytes), stays within `budget`."""

    def need(t: int) -> float:
        return need_a + (need_b - need_a) * (t - t_a) / (t_b - t_a)

    if need(T) <= budget:
        return T
    t = (T - 1) // LARGEST_CHUNK * LARGEST_CHUNK
    while t > 2 * LARGEST_CHUNK and need(t) > budget:
        t -= LARGEST_CHUNK
    return max(t, 2 * LARGEST_CHUNK)


def _chunk_grad_T(case: Case, spec: OpSpec) -> int:
    """The longest T at which the chunked reference's forward and backward fit in the device memory free now.

    On a GPU its peak (what autograd keeps grows with T, one set per chunk) is measured at two and four chunks of
    the case's other dims and extrapolated along T, against :data:`GRAD_REFERENCE_MEMORY_SHARE` of the free memory
    (at most of this process's share of the device, :func:`deltabench.harness.devices.allocator_fraction`):
    sdm's flagship (S = 65536, D = 1024) keeps about 1.75 GiB a chunk, 220 GiB at T = 8192. On the CPU the host
    memory check (harness/memory_need.py) has judged the case already: the full T."""
    if not case.torch_device.startswith("cuda") or case.T <= 4 * LARGEST_CHUNK:
        return case.T
    dev = case.torch_device
    peaks = []
    for t in (2 * LARGEST_CHUNK, 4 * LARGEST_CHUNK):
        sub = case.replace(T=t, initial_state=True)
        inputs = make_case_inputs(spec, sub)
        cot = _cotangents(spec, sub, case.seed)
        torch.cuda.synchronize(dev)
        before = torch.cuda.memory_allocated(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        _call(_chunk_reference(case), spec, _fp32_inputs(inputs), (cot[0].float(), cot[1]))
        torch.cuda.synchronize(dev)
        peaks.append(torch.cuda.max_memory_allocated(dev) - before)
    free, total = torch.cuda.mem_get_info(dev)
    mine = free + torch.cuda.memory_reserved(dev) - torch.cuda.memory_allocated(dev)
    # gates side by side (--gate-workers) would each see the same free memory: each takes its share of the device
    budget = GRAD_REFERENCE_MEMORY_SHARE * min(mine, allocator_fraction(device_share(), total) * total)
    return fitting_T(case.T, peaks[0], peaks[1], 2 * LARGEST_CHUNK, 4 * LARGEST_CHUNK, budget)


def _grad_at(
    impl: Callable[..., Any],
    spec: OpSpec,
    mid: Case,
    runs: list[tuple[int, _Variant]],
    *,
    profile: str,
) -> list[CheckRecord]:
    """The impl's gradients (and outputs) at `mid`, the longest T whose chunked reference's backward fits, against
    that reference for every (seed, variant) of `runs`, each with a record that the call left its inputs alone."""
    records: list[CheckRecord] = []
    label = f"torch_chunk_fp32 at {mid.shape_id} (its backward at full T does not fit)"
    for seed, variant in runs:
        it = _run_impl(impl, spec, mid, variant, seed=seed, grads=True)
        records += _compare_items([it], [_chunk_run(mid, spec, it)], label, grads=True, profile=profile)
        where = {"seed": seed, "regime": variant.regime, "initial_state": variant.h0}
        records.append(_unchanged_record([it.run], reference=f"the inputs before the call at {mid.shape_id}", **where))
    return records


def _chunk_reference(case: Case) -> Callable[..., Any]:
    from .registry import get_impl

    return get_impl(case.op, "torch_chunk")


@dataclasses.dataclass
class _Item:
    """One run of the impl: its case (regime and h0 set), variant, inputs, cotangents, result and records."""

    case: Case
    variant: _Variant
    seed: int
    inputs: dict[str, torch.Tensor]
    cot: tuple[torch.Tensor, torch.Tensor] | None
    run: _Run
    records: list[CheckRecord]


def _run_impl(fn: Callable[..., Any], spec: OpSpec, case: Case, variant: _Variant, *, seed: int, grads: bool) -> _Item:
    """Call the impl on the case's inputs at (seed, variant): the contract and finiteness records."""
    h0 = variant.h0
    sub = case.replace(seed=seed, initial_state=h0, regime=variant.regime)
    inputs = make_case_inputs(spec, sub, unit_qk=variant.unit_qk)
    cot = _cotangents(spec, sub, seed) if grads else None
    if cot is not None and not getattr(fn, "state_grad", True):
        cot = (cot[0], torch.zeros_like(cot[1]))
    run = _call(fn, spec, inputs, cot, scale=variant.scale(spec, sub.dims))
    where = {"seed": seed, "regime": sub.regime, "initial_state": h0}
    records = _contract(run, spec, sub, **where)
    records.append(finite_record(run.tensors(), **where))
    return _Item(sub, variant, seed, inputs, cot, run, records)


def _oracle_runs(spec: OpSpec, items: list[_Item], limit: float) -> list[_Run]:
    """The float64 oracle on every item's inputs, in as few calls as `limit` (B*T*H*K*V per call; on a GPU at
    least the forward's, :func:`_stack_limit`) allows.

    The oracle's cost is a Python loop over tokens, nearly independent of B at the gate's sizes, so the items are
    stacked along B: a zero initial state where an item has none (its gradient dropped), each item's scale
    applied to its q (``o`` is linear in ``scale * q``), and, where the op allows it, shorter sequences padded
    to the longest with identity tokens (zero inputs and gates, a zero cotangent).
    """
    groups: list[list[int]] = []
    for i, it in enumerate(items):
        if groups and _stacks_onto(spec, [items[j] for j in groups[-1]], it, limit):
            groups[-1].append(i)
        else:
            groups.append([i])
    runs: list[_Run | None] = [None] * len(items)
    for g in groups:
        group = [items[i] for i in g]
        for i, run in zip(
            g, _shared_runs("oracle", group, lambda group=group: _oracle_stacked(spec, group)), strict=True
        ):
            runs[i] = run
    return [r for r in runs if r is not None]


def _stacks_onto(spec: OpSpec, group: list[_Item], it: _Item, limit: float) -> bool:
    """Whether `it` joins `group` in one stacked oracle call (:func:`_oracle_runs`; `limit` as given there)."""
    if _stack_key(group[0]) != _stack_key(it):
        return False
    if not spec.zero_token_is_identity and group[0].case.T != it.case.T:
        return False
    T = max(x.case.T for x in [*group, it])
    stacked = it.case.replace(B=sum(x.case.B for x in [*group, it]), T=T)
    return _cost(stacked) <= _stack_limit(group[0].case, limit)


def _stack_limit(case: Case, limit: float) -> float:
    """How large one stacked oracle call may be: `limit` on the CPU (its time per element, its memory for
    autograd); on a GPU, where a call's time is its kernel launches (a few per token, whatever B), at least the
    forward's :data:`ORACLE_MAX_ELEMENTS` (a few GB of autograd memory), so that a case's runs with gradients take
    a few calls rather than one each. The reduced case itself still follows `limit` (module docstring)."""
    return limit if oracle_device(case).type == "cpu" else max(limit, ORACLE_MAX_ELEMENTS)


def _shared_runs(kind: str, items: list[_Item], compute: Callable[[], list[_Run]]) -> list[_Run]:
    """The reference runs of `items`, shared with every impl gated on the same case through the on-disk cache
    (harness/reference_cache.py). The key names each item's draw (its B, T, seed, regime, initial state, scale
    and q/k norm), so two calls that share a key ran the reference on identical inputs."""
    draws = ";".join(
        f"B{it.case.B},T{it.case.T},s{it.seed},{it.case.regime},h{int(it.variant.h0)},{it.variant.label()}"
        for it in items
    )
    origin = draw_origin(items[0].case.torch_device)
    if origin != "cpu":  # the draws, and so the reference, depend on the generator's device (references/_inputs.py)
        draws += f";drawn on {origin}"
    grads = items[0].cot is not None
    if grads and not bool(items[0].cot[1].any()):  # an impl declared state_grad=False: the output's cotangent alone
        draws += ";no state cotangent"
    flat = cached_reference(
        items[0].case,
        kind=kind,
        draws=draws,
        grads=grads,
        compute=lambda: {f"{i}/{n}": t for i, run in enumerate(compute()) for n, t in run.tensors().items()},
    )
    runs = []
    for i in range(len(items)):
        mine = {n.split("/", 1)[1]: t for n, t in flat.items() if n.split("/", 1)[0] == str(i)}
        grad_of = {n[len("grad:") :]: t for n, t in mine.items() if n.startswith("grad:")}
        runs.append(_Run(o=mine["o"], state=mine["final_state"], grads=grad_of))
    return runs


def _stack_key(item: _Item) -> tuple[Any, ...]:
    """Items stack along B when every dim but B and T agrees (and both are, or are not, back-propagated)."""
    options = tuple(sorted(_options(item.inputs).items()))
    return (*(v for d, v in item.case.dims.items() if d not in ("B", "T")), options, item.cot is not None)


def _padded(x: torch.Tensor, T: int) -> torch.Tensor:
    """`x` [B, t, ...] padded with zeros along dim 1 to T tokens."""
    if x.shape[1] == T:
        return x
    return torch.cat([x, x.new_zeros(x.shape[0], T - x.shape[1], *x.shape[2:])], dim=1)


def _oracle_stacked(spec: OpSpec, items: list[_Item]) -> list[_Run]:
    """One oracle call on `items` stacked along B (see :func:`_oracle_runs`), on :func:`oracle_device`: the
    same code on either device, only where its tensors live differs."""
    T = max(it.case.T for it in items)
    dev = oracle_device(items[0].case)

    def on_dev(x: torch.Tensor) -> torch.Tensor:
        return x.detach().to(dev, torch.float64) if x.is_floating_point() else x.detach().to(dev)

    def row(it: _Item, n: str) -> torch.Tensor:
        return _padded(on_dev(it.inputs[n]), T) if spec.arg(n).sequence else on_dev(it.inputs[n])

    stacked = {n: torch.cat([row(it, n) for it in items]) for n in spec.args}
    states = []
    for it in items:
        h0 = it.inputs.get(spec.state_arg)
        zeros = torch.zeros(*spec.state.shape(it.case.dims), dtype=torch.float64, device=dev)
        states.append(on_dev(h0) if h0 is not None else zeros)
    stacked[spec.state_arg] = torch.cat(states)
    stacked.update(_options(items[0].inputs))  # the same for every stacked item (_stack_key)
    ratio = torch.tensor(
        [1.0 if it.variant.scale_factor is None else it.variant.scale_factor for it in items for _ in range(it.case.B)],
        dtype=torch.float64,
        device=dev,
    )
    scaled = None if spec.scale is None else spec.args.index(spec.scale[0])

    def oracle(*args: torch.Tensor, **kwargs: Any) -> Any:
        # o is linear in scale * q: each stacked row's own scale is applied to its q, the oracle given the default.
        if scaled is not None:
            args = tuple(x * ratio.reshape(-1, *[1] * (x.dim() - 1)) if i == scaled else x for i, x in enumerate(args))
        options = {n: x for n, x in kwargs.items() if n not in (spec.state_arg, "scale")}
        return spec.oracle(*args, **_kwargs(spec, None, kwargs[spec.state_arg]), **options)

    cot = None
    if items[0].cot is not None:
        cot = (
            torch.cat([_padded(on_dev(it.cot[0]), T) for it in items]),
            torch.cat([on_dev(it.cot[1]) for it in items]),
        )
    whole = _call(oracle, spec, stacked, cot)
    runs, row = [], 0
    for it in items:
        rows, t = slice(row, row + it.case.B), it.case.T
        row += it.case.B
        grads = {
            n: (None if x is None else x[rows, :t] if spec.arg(n).sequence else x[rows]) for n, x in whole.grads.items()
        }
        if not it.variant.h0:
            grads.pop(spec.state_arg, None)
        runs.append(_Run(o=whole.o[rows, :t], state=whole.state[rows], grads=grads))
    return runs


def _chunk_run(case: Case, spec: OpSpec, item: _Item) -> _Run:
    """The op's torch_chunk in fp32 on the item's inputs (the full-shape reference when the oracle is too costly),
    back-propagated when the item carries cotangents."""
    ref_cot = (
        None if item.cot is None else (item.cot[0].float().to(case.torch_device), item.cot[1].to(case.torch_device))
    )

    def compute() -> list[_Run]:
        chunk = _chunk_reference(case)
        return [_call(chunk, spec, _fp32_inputs(item.inputs), ref_cot, scale=item.variant.scale(spec, case.dims))]

    (run,) = _shared_runs("torch_chunk", [item], compute)
    return run


def _failed(records: list[CheckRecord]) -> bool:
    """Whether any gating record of `records` failed."""
    return any(r.gating and not r.passed for r in records)


def _compare_items(
    items: list[_Item], refs: list[_Run], reference_label: str, *, grads: bool, profile: str
) -> list[CheckRecord]:
    """Every item's run against its reference run: its own records, then the comparisons."""
    records: list[CheckRecord] = []
    for it, ref in zip(items, refs, strict=True):
        label = ", ".join(x for x in (reference_label, it.variant.label()) if x)
        records += it.records
        records += _compare_runs(
            it.run, ref, it.case, seed=it.seed, h0=it.variant.h0, reference=label, grads=grads, profile=profile
        )
    return records


def _variants(spec: OpSpec, regimes: tuple[str, ...]) -> list[_Variant]:
    """The runs of one seed: each regime without and with an initial state; the runs with one pass the
    non-default scale (and are streamed), and the last regime's run without one draws q and k off the unit sphere.
    The runs without an initial state keep the default scale, the arguments the runner times with: a compiling
    impl (JAX, whose ``scale`` is static) reuses that program."""
    out = []
    for i, regime in enumerate(regimes):
        out.append(_Variant(regime, h0=False, unit_qk=i != len(regimes) - 1 or not spec.unit_norm_variant))
        out.append(_Variant(regime, h0=True, scale_factor=ALT_SCALE if spec.scale is not None else None))
    return out


def _regimes(spec: OpSpec, regimes: str | tuple[str, ...] | list[str] | None) -> tuple[str, ...]:
    known = spec.regimes
    if regimes is None:
        return known
    chosen = (regimes,) if isinstance(regimes, str) else tuple(regimes)
    unknown = [r for r in chosen if r not in known]
    if unknown or not chosen:
        raise BadInput(f"unknown gate regime {', '.join(map(repr, unknown)) or '(none)'}: use {', '.join(known)}")
    return tuple(dict.fromkeys(chosen))


def _length_sweep(
    impl: Callable[..., Any],
    spec: OpSpec,
    lengths: list[tuple[Case, int | None]],
    *,
    seed: int,
    grads: bool,
    profile: str,
    limit: float,
) -> list[CheckRecord]:
    """The impl at the sweep's cases (:func:`_sweep_cases`: one seed, with an initial state), each against the
    oracle and streamed at its split, then one record that no call wrote into its inputs."""
    records: list[CheckRecord] = []
    runs: list[_Run] = []
    items: list[_Item] = []
    splits: list[int | None] = []
    check_case = getattr(impl, "check_case", None)
    for sub, t1 in lengths:
        why = check_case(sub) if check_case is not None else None
        if why:
            records.append(note_record(f"length T={sub.T}", f"not run: {why}", passed=True, gating=False, seed=seed))
            continue
        items.append(_run_impl(impl, spec, sub, _Variant(sub.regime, h0=True), seed=seed, grads=grads))
        splits.append(t1)
    for item, ref, t1 in zip(items, _oracle_runs(spec, items, limit), splits, strict=True):
        records += _compare_items([item], [ref], f"oracle at {item.case.shape_id}", grads=grads, profile=profile)
        stream, calls = [], []
        if spec.streaming:
            stream, calls = _streaming(
                impl, spec, item.case, item.inputs, item.run, seed=seed, h0=True, profile=profile, t1=t1
            )
        records += stream
        runs += [item.run, *calls]
    if runs:
        records.append(_unchanged_record(runs, seed=seed, regime=None, initial_state=True))
    return records


def _sweep_cases(case: Case, regimes: tuple[str, ...], *, grads: bool, limit: float) -> list[tuple[Case, int | None]]:
    """The length sweep's cases (B = 1, the case's other dims, the long regime where it is run) and their splits."""
    regime = "long" if "long" in regimes else regimes[0]
    batch = {"B": SWEEP_B} if "B" in case.dims else {}
    mode = case.mode if grads else "fwd"
    return [
        (case.replace(**batch, T=T, regime=regime, mode=mode), t1)
        for T, t1 in sweep_lengths(case.T, _sweep_chunks(case, limit))
    ]


def _reduced_oracle(
    impl: Callable[..., Any],
    spec: OpSpec,
    short: Case,
    runs: list[tuple[int, _Variant]],
    *,
    grads: bool,
    profile: str,
    limit: float,
) -> list[CheckRecord]:
    """The impl at the reduced case `short` for every (seed, variant) of `runs`, against the oracle, each with a
    record that the call left its inputs unchanged. The runs are made and checked a stacked oracle call at a time
    (:func:`_stacks_onto`), so that only those runs' tensors are held at once: an op whose state is large (sdm's
    flagship bank, 512 MiB a run and as much again for its gradient) held a gate's every run otherwise."""
    label = f"oracle at {short.shape_id}"
    records: list[CheckRecord] = []
    group: list[_Item] = []

    def check(group: list[_Item]) -> None:
        records.extend(_compare_items(group, _oracle_runs(spec, group, limit), label, grads=grads, profile=profile))
        for it in group:
            where = {"seed": it.seed, "regime": it.variant.regime, "initial_state": it.variant.h0}
            reference = f"the inputs before the call at {short.shape_id}"
            records.append(_unchanged_record([it.run], reference=reference, **where))

    for seed, variant in runs:
        it = _run_impl(impl, spec, short, variant, seed=seed, grads=grads)
        if group and not _stacks_onto(spec, group, it, limit):
            check(group)
            group = []
        group.append(it)
    if group:
        check(group)
    return records


def _memo_key(kind: str, impl: Callable[..., Any], *parts: Any) -> tuple[Any, ...]:
    """A reduced check's key in a :class:`GateMemo`: its kind, the impl (name, backend, where it was registered
    from) and what the check was given (cases as sorted items, so that equal cases give equal keys)."""

    def frozen(x: Any) -> Any:
        if isinstance(x, Case):
            return tuple(sorted(x.to_dict().items()))
        if isinstance(x, (list, tuple)):
            return tuple(frozen(y) for y in x)
        return x

    who = (getattr(impl, "name", None), getattr(impl, "backend", None), getattr(impl, "source", None))
    return (kind, who, *(frozen(p) for p in parts))


def _back_propagates(impl: Callable[..., Any], case: Case) -> bool:
    """Whether a gate of `impl` at `case` back-propagates: a mode other than ``fwd`` and an impl with a backward."""
    return case.mode != "fwd" and getattr(impl, "supports_backward", True)


def _oracle_choice(case: Case, grads: bool, reference: str, oracle_max_elements: float | None) -> tuple[float, bool]:
    """The oracle's element limit for a gate at `case` and whether the oracle takes the full shape (else the chunked
    reference does, and the oracle a reduced case): one rule for :func:`verify_case` and :func:`gate_shapes`."""
    limit = oracle_max_elements or (ORACLE_MAX_ELEMENTS_GRAD if grads else ORACLE_MAX_ELEMENTS)
    return limit, reference == "oracle" or (reference == "auto" and _cost(case) <= limit)


def gate_shapes(
    impl: Callable[..., Any],
    case: Case,
    *,
    regimes: str | tuple[str, ...] | list[str] | None = None,
    reference: str = "auto",
    oracle_max_elements: float | None = None,
) -> list[Case]:
    """The shapes :func:`verify_case` calls `impl` at for `case`, each once, as cases (the regime `case`'s; the mode
    ``fwd`` where no call at that shape back-propagates): the full shape, its streaming halves, the oracle's reduced
    case and the length sweep's lengths with theirs. For impls that compile each new shape, so that a run can
    compile them side by side before the gate (runners/session.py). Not listed: the shorter length at which a GPU
    gate may back-propagate the chunked reference, which it measures on the device (module docstring)."""
    spec = get_op(case.op)
    chosen = _regimes(spec, regimes)
    grads = _back_propagates(impl, case)
    limit, use_oracle = _oracle_choice(case, grads, reference, oracle_max_elements)
    called: list[tuple[Case, int | None]] = [(case, split_point(case.T))]
    if not use_oracle:
        called.append((_short_case(case, limit), None))
    called += _sweep_cases(case, chosen, grads=grads, limit=limit)
    shapes: dict[str, Case] = {}

    def add(sub: Case, back: bool) -> None:
        sub = sub.replace(regime=case.regime, mode=case.mode if back else "fwd", seed=case.seed)
        if shapes.get(sub.shape_id) is None or back:
            shapes[sub.shape_id] = sub

    for sub, t1 in called:
        add(sub, grads)
        if spec.streaming and t1 is not None:
            t1, _ = _split_the_impl_runs(impl, sub, t1)
            if t1 is not None:
                add(sub.replace(T=t1), False)
                add(sub.replace(T=sub.T - t1), False)
    return list(shapes.values())


def warm_calls(impl: Callable[..., Any], case: Case) -> None:
    """Call `impl` at `case` as a gate does (:func:`gate_shapes` lists where): without an initial state at the
    default scale and with one at the gate's other scale, back-propagating where ``case.mode`` is not ``fwd``.
    Nothing is checked: what an impl that compiles each shape compiled is kept in its own cache for the gate."""
    spec = get_op(case.op)
    grads = _back_propagates(impl, case)
    for variant in _variants(spec, (case.regime,)):
        _run_impl(impl, spec, case, variant, seed=case.seed, grads=grads)


def verify_case(
    impl: Callable[..., Any],
    case: Case,
    *,
    seeds: int = 3,
    extra_seed: bool = True,
    gate_determinism: bool = False,
    reference: str = "auto",
    oracle_max_elements: float | None = None,
    regimes: str | tuple[str, ...] | list[str] | None = None,
    fresh_process: bool = False,
    imports: list[str] | tuple[str, ...] = (),
    drawn_seed: int | None = None,
    memo: GateMemo | None = None,
    grad_reference_T: int | None = None,
    stop_at_failure: bool = False,
) -> VerifyReport:
    """Verify `impl` (an Impl or any callable with the op's signature) on `case`; see the module docstring.

    Args:
        impl: the implementation under test.
        case: op, dims, dtype, seed (the first of `seeds` consecutive ones), mode and device (``case.regime`` is
            the regime the case is timed in; the gate runs `regimes`).
        seeds: how many consecutive seeds, from ``case.seed``.
        extra_seed: also use a seed drawn at run time (recorded in the report).
        gate_determinism: make the bitwise-determinism record gating (it always is when the op's contract says
            ``deterministic``).
        reference: ``"auto"``, ``"oracle"`` (always the float64 oracle) or ``"torch_chunk"`` (the chunked
            torch reference in fp32 at the full shape plus the oracle at a reduced case).
        oracle_max_elements: B*T*H*K*V above which ``"auto"`` leaves the oracle (default 2e8, 4e7 with gradients).
        regimes: the gate regimes to run (default: every one, ``typical``, ``long`` and ``strong``).
        fresh_process: where determinism gates, also replay the determinism call in a fresh interpreter
            (``determinism:process``; `impl` must be a registered impl, which the new process finds by name).
        imports: the ``--import`` modules that new process loads first (where `impl` comes from one).
        drawn_seed: the extra seed when the caller drew it (a run draws one for all its jobs); None: drawn here.
        memo: reduced-case records made earlier in this process's run, reused (marked) when identical.
        grad_reference_T: with gradients against torch_chunk, the T at which its backward runs; below the case's
            T, the full shape compares outputs and final states alone (module docstring). None: the longest T
            that fits in the device memory (measured on a GPU; the full T on the CPU).
        stop_at_failure: end the gate at the first run at the full shape with a failing check (one seed and
            variant; all of them at once where the oracle takes the full shape), with a note record saying what
            was not run: a runner's gate, whose verdict that failure already settles. False: every check.

    Returns:
        A :class:`VerifyReport`; ``.passed`` is True when every gating record passed.
    """
    if seeds < 1 and not extra_seed:
        raise BadInput("verify needs at least one seed")
    spec = get_op(case.op)
    chosen_regimes = _regimes(spec, regimes)
    name = getattr(impl, "name", getattr(impl, "__name__", "impl"))
    grads = _back_propagates(impl, case)
    if reference not in ("auto", "oracle", "torch_chunk"):
        raise BadInput(f"unknown reference {reference!r}: use auto, oracle or torch_chunk")
    limit, use_oracle = _oracle_choice(case, grads, reference, oracle_max_elements)
    drawn = (draw_seed() if drawn_seed is None else drawn_seed) if extra_seed else None
    seed_list = [case.seed + i for i in range(max(seeds, 0))] + ([drawn] if drawn is not None else [])

    def reduced(key: tuple[Any, ...], make: Callable[[], list[CheckRecord]]) -> list[CheckRecord]:
        return make() if memo is None else memo.records(key, make)

    records: list[CheckRecord] = []
    if case.mode != "fwd" and not grads:
        records.append(note_record("gradients", "not checked: the impl is forward only", passed=True, gating=False))
    if grads and not getattr(impl, "state_grad", True):
        why = "the cotangent is on the output alone: the impl declares its final state without a gradient"
        records.append(note_record("gradients", why, passed=True, gating=False))
    # Triton on the CPU runs in its interpreter, whose bf16 casts truncate: its own bf16 bound (tolerances.py).
    interpreted = getattr(impl, "backend", "") == "triton" and case.device == "cpu"
    profile = "triton_interpreter" if interpreted else "native"
    short = None if use_oracle else _short_case(case, limit)
    lengths = _sweep_cases(case, chosen_regimes, grads=grads, limit=limit)
    first_run: _Item | None = None
    variants = _variants(spec, chosen_regimes)
    runs = [(s, v) for s in seed_list for v in variants]
    clock = _StageClock()
    grad_t = case.T  # where the chunked reference's backward runs: below the case's T when it does not fit there

    def streamed(it: _Item) -> list[CheckRecord]:
        """`it` streamed where it has an initial state (the resumed half has one anyway), at the default scale (a
        compiling impl keeps to the shapes and static arguments it already has), and its inputs-unchanged record."""
        stream, stream_calls = [], []
        if it.variant.h0 and spec.streaming:
            with clock("streaming"):
                stream, stream_calls = _streaming(
                    impl, spec, it.case, it.inputs, it.run, seed=it.seed, h0=True, profile=profile,
                    scale=it.variant.scale(spec, case.dims),
                )  # fmt: skip
        where = {"seed": it.seed, "regime": it.variant.regime, "initial_state": it.variant.h0}
        return [*stream, _unchanged_record([it.run, *stream_calls], **where)]

    if use_oracle:
        # every run at once: the oracle stacks them along B, at the cost of about one (_oracle_runs)
        with clock("impl at full shape"):
            items = [_run_impl(impl, spec, case, v, seed=s, grads=grads) for s, v in runs]
        full_runs = len(items)
        with clock("oracle at full shape"):
            oracle = _oracle_runs(spec, items, limit)
        records += _compare_items(items, oracle, "oracle", grads=grads, profile=profile)
        del oracle
        for it in [] if stop_at_failure and _failed(records) else items:
            records += streamed(it)
            if first_run is None and it.variant.h0:
                first_run = it
    else:
        if grads:
            with clock("reference's backward T"):
                grad_t = min(case.T, grad_reference_T or _chunk_grad_T(case, spec))
        # Where grad_t < T, forward only at the full shape: the reference's backward there would run the device out
        # of memory.
        full_runs = 0
        label = f"torch_chunk_fp32 forward only (its backward fits at T={grad_t}, not T={case.T})"
        # One run at a time against its reference, so that a gate may stop at its first failure and holds one run's
        # tensors at a time (and the first with an initial state, for the determinism check).
        for s, v in runs:
            with clock("impl at full shape"):
                it = _run_impl(impl, spec, case, v, seed=s, grads=grads)
            full_runs += 1
            if grad_t < case.T:
                with clock("reference at full shape"):
                    ref = _chunk_run(case, spec, dataclasses.replace(it, cot=None))
                found = _compare_items([it], [ref], label, grads=False, profile=profile)
                del ref  # the reference's device memory, before the gate's next allocations
                with clock(f"impl and reference fwd+bwd at T={grad_t}"):
                    found += _grad_at(impl, spec, case.replace(T=grad_t), [(s, v)], profile=profile)
            else:
                with clock("reference at full shape"):
                    ref = _chunk_run(case, spec, it)
                found = _compare_items([it], [ref], "torch_chunk_fp32", grads=grads, profile=profile)
                del ref
            records += found
            if stop_at_failure and _failed(found):
                break
            records += streamed(it)
            if first_run is None and it.variant.h0:
                first_run = it
            del it
    stopped = stop_at_failure and _failed(records)
    if stopped:
        done = f"{full_runs} of {len(runs)} runs at the full shape"
        why = f"stopped at its first failure ({done}); the reduced-case, streaming and length checks not run"
        records.append(note_record("gate", why, passed=True, gating=False))
    elif not use_oracle:
        key = _memo_key("oracle", impl, short, runs, grads, profile, limit)
        with clock(f"oracle at {short.shape_id}"):
            records += reduced(
                key, lambda: _reduced_oracle(impl, spec, short, runs, grads=grads, profile=profile, limit=limit)
            )
    if use_oracle:
        sentence = "float64 oracle"
    else:
        full_t = "at full T" if grad_t == case.T else f"at full T forward only, fwd+bwd at T={grad_t}"
        sentence = f"torch_chunk in fp32 {full_t}, float64 oracle at {short.shape_id}"
    sentence += f"; regimes {', '.join(chosen_regimes)}; lengths " + ", ".join(f"T={c.T}" for c, _ in lengths)
    if interpreted and case.dtype == "bf16":
        sentence += " (bf16 bounds of the Triton interpreter, whose casts truncate)"
    if not stopped:
        key = _memo_key("sweep", impl, lengths, seed_list[0], grads, profile, limit)
        with clock("length sweep"):
            records += reduced(
                key,
                lambda: _length_sweep(
                    impl, spec, lengths, seed=seed_list[0], grads=grads, profile=profile, limit=limit
                ),
            )
    if first_run is not None and not stopped:
        with clock("determinism"):
            scale = first_run.variant.scale(spec, case.dims)
            again = _call(impl, spec, first_run.inputs, first_run.cot, scale=scale)
            gating = gate_determinism or spec.deterministic
            where = {"gating": gating, "seed": first_run.seed, "regime": first_run.variant.regime}
            records.append(_determinism(first_run.run, again.tensors(), **where))
        if gating and fresh_process:
            with clock("fresh process"):
                records.append(_fresh_process_determinism(impl, case, first_run, imports, **where))
    return VerifyReport(
        case=case, impl=name, records=records, seeds=seed_list, drawn_seed=drawn, reference=sentence,
        stage_s=clock.seconds,
    )  # fmt: skip
