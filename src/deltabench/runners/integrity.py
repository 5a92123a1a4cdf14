"""Integrity of timed calls: what keeps a kernel from gaming its own timing.

The correctness gate checks an impl's outputs at the gate's calls; the defences here check the calls that are
timed, and the clock that times them. Each yields an ``integrity:<defence>`` :class:`CheckRecord` in the job's
``verification`` records (``JobResult.integrity`` lists them); a failed one makes the job ``incorrect``, with no
timing (:func:`flag`).

- ``integrity:inputs``: the float inputs the contract differentiates (and the initial state) are scaled in place
  by a fresh random factor in [0.5, 1) before every timed call, outside the timed region, from copies taken before
  timing: no two timed calls see the same contents, so a cache keyed by pointer or by content gives stale outputs
  and one keyed by content never hits. A shrinking factor keeps every bounded input (gates, betas, unit norms) in
  its domain. Not applicable to ``bwd`` (one forward graph replayed) nor to a timer that does not take a guard.
- ``integrity:recheck``: one timed call at a random position in each range of :data:`SAMPLE_BUCKETS` that the
  loop reaches (drawn from ``os.urandom`` before timing) has its outputs (``fwd``: output and final state;
  ``fwd+bwd``: the gradients) copied the moment its clock stops; the loop's last call is added as its outputs stand
  after the loop. Whether a call is sampled is acted on only after it returned, so nothing before a call (its
  inputs, its gap from the last one) tells a sampled call apart. After the loop each is compared with the reference
  for its very inputs (rebuilt from their factors; the op's built-in chunked PyTorch impl in fp32, else the float64
  oracle) under the gate's bounds. An output that is not a plain tensor (a lazy object, a tensor subclass) fails it.
- ``integrity:poison``: before every timed call the previous call's output tensors (those sharing no storage with
  an input) are filled with NaN: an impl that hands back a buffer it did not write (a reused output object, a
  cached tensor) returns the poison, which the recheck finds; this record names it.
- ``integrity:threads``: the set of live Python threads after each timed call is the one before timing: no work
  left running on a thread the impl started.
- ``integrity:hooks`` (runners/integrity_hooks.py): during the loop, the introspection that would find the guard
  (``gc`` object walks, frame access), profile and trace functions, ``ctypes`` and signals sent to the process are
  refused; after each call no interval timer is armed, no profile or trace function set, ``gc``'s callbacks and the
  count of Python threads are unchanged.
- ``integrity:clock``: the timing functions (``time.perf_counter``, ``perf_counter_ns``, ``monotonic``, the
  ``statistics`` functions and deltabench's own timers and summary) are resolved when this module is imported,
  before any user module, and are the same objects with the same code after the timing; the timers call the copies
  resolved then.
- ``integrity:wall_clock``: the timed loop's span on the timer's clock and on an independent one
  (``time.monotonic_ns``, resolved at import) agree, the samples' sum fits within it, the time the loop spent
  outside both the timed calls and the guard is not larger than the timed calls' (work finished between the
  calls), and the timing summary's samples and median are the ones the guard recorded itself.
- ``integrity:plausibility`` (the run's parent, ``runners/session.py``): the achieved FLOP/s and bytes/s are below
  the machine's measured ceilings (``pct_of_floor`` <= :data:`PLAUSIBLE_PCT_OF_FLOOR`).
- ``integrity:cost``: not a check (never gating): the seconds the guard spent in and after the loop.

Only a timer that calls the job's subject itself takes a guard (``Timer.takes_guard``: the host clock); a job of
another timer (CUDA events, JAX) gets the clock and plausibility records.
"""

from __future__ import annotations

import math
import random
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from deltabench.correctness.calls import call_impl, fp32_inputs
from deltabench.correctness.checks import rel_fro
from deltabench.correctness.tolerances import threshold
from deltabench.harness.cases import Case, has_backward
from deltabench.harness.document import CheckRecord, TimingStats
from deltabench.harness.ops import get_op

from . import cpu as _cpu
from . import integrity_hooks as _hooks
from . import timing as _timing
from .cuda_integrity import ghost_launches, ghost_record
from .integrity_records import INTEGRITY_PREFIX, integrity_record

__all__ = [
    "INTEGRITY_PREFIX",
    "PLAUSIBLE_PCT_OF_FLOOR",
    "SAMPLE_BUCKETS",
    "TimedCallGuard",
    "clock_record",
    "flag",
    "guard_functions",
    "guarded_functions",
    "plausibility_record",
]

# Sampled calls: one at a random position in each bucket of call indices (warm-up calls included) that the loop
# reaches; later buckets are wider, so a long loop costs as few re-checks as a short one.
SAMPLE_BUCKETS: tuple[tuple[int, int], ...] = ((0, 4), (4, 32), (32, 256), (256, 2048), (2048, 1 << 20))
# The perturbation's factors: shrinking only, so that bounded inputs stay in their domains.
_FACTOR_LOW, _FACTOR_HIGH = 0.5, 1.0
# The two clocks over the timed loop may differ by this share of it (plus _CLOCK_SLACK_NS): they tick together.
_CLOCK_AGREEMENT = 0.02
_CLOCK_SLACK_NS = 2_000_000
# Time in the loop outside both the timed calls and the guard: the loop's own bookkeeping (a few microseconds a
# call, a statistic a batch). More than the timed calls' own time is work done between them.
_UNTIMED_SHARE = 1.0
_UNTIMED_SLACK_NS = 5_000_000
# Achieved rates above the measured ceilings by more than the ceilings' own measurement noise: impossible.
PLAUSIBLE_PCT_OF_FLOOR = 110.0

_CLOCK_NS = time.perf_counter_ns  # the timer's clock, as it was before any user module ran
_OTHER_CLOCK_NS = time.monotonic_ns  # the independent clock of the cross-check
_MEDIAN = statistics.median
_TIMERS = dict(_timing.TIMERS)  # the timer table as shipped


_TABLE: dict[str, tuple[Any, str]] = {}  # dotted name -> (owner, attribute) of every guarded function
_RESOLVED: dict[str, Any] = {}  # dotted name -> the object resolved before any user module ran
_CODE: dict[str, Any] = {}  # dotted name -> that object's __code__, for a Python function


def guard_functions(owner: Any, names: Sequence[str], prefix: str | None = None) -> None:
    """Resolve `owner`'s attributes `names` now, for :func:`clock_record` to find unchanged later. Called at import
    of deltabench's runner modules (this one, ``runners.job``), before any user module is imported."""
    prefix = prefix if prefix is not None else getattr(owner, "__name__", repr(owner))
    for n in names:
        _TABLE[f"{prefix}.{n}"] = (owner, n)
        _RESOLVED[f"{prefix}.{n}"] = getattr(owner, n)
        _CODE[f"{prefix}.{n}"] = _code_of(getattr(owner, n))


def _code_of(fn: Any) -> Any:
    """A Python function's (or method's) code and defaults: what swapping its ``__code__`` changes while the object
    stays the same (None for a builtin)."""
    fn = getattr(fn, "__func__", fn)
    code = getattr(fn, "__code__", None)
    return None if code is None else (code, getattr(fn, "__defaults__", None), getattr(fn, "__kwdefaults__", None))


def _guard_defaults() -> None:
    from deltabench.correctness import calls, checks, tolerances

    guard_functions(time, ("perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns"))
    guard_functions(statistics, ("median", "fmean", "stdev"))
    guard_functions(threading, ("enumerate",))
    guard_functions(torch.Tensor, ("clone", "copy_", "mul_", "fill_"), "torch.Tensor")
    guard_functions(_timing, ("summarize", "sem_rel", "quantile", "adaptive_samples", "time_on_host_clock"))
    guard_functions(_timing, ("timer_for", "merge_repetitions", "_clock_ns", "_clock_s"))
    guard_functions(_timing.HOST_CLOCK, ("target",), "deltabench.runners.timing.HOST_CLOCK")
    guard_functions(_cpu, ("time_callable", "time_job"))
    guard_functions(checks, ("rel_fro",))
    guard_functions(tolerances, ("threshold",))
    guard_functions(calls, ("call_impl", "fp32_inputs"))


def guarded_functions() -> dict[str, Any]:
    """The timing functions as they were resolved when deltabench's runner was imported, by dotted name."""
    return dict(_RESOLVED)


_record = integrity_record


def clock_record() -> CheckRecord:
    """``integrity:clock``: every guarded timing function is still the object resolved before any user import."""
    changed = [name for name, (owner, attr) in _TABLE.items() if getattr(owner, attr, None) is not _RESOLVED[name]]
    changed += [
        f"{name} (its code)"
        for name, code in _CODE.items()
        if code is not None and name not in changed and not _same_code(_code_of(_RESOLVED[name]), code)
    ]
    table = _timing.TIMERS
    if table.keys() != _TIMERS.keys() or any(table[k] is not v for k, v in _TIMERS.items()):
        changed.append("deltabench.runners.timing.TIMERS")
    detail = "replaced after import: " + ", ".join(changed) if changed else f"{len(_RESOLVED)} timing functions intact"
    return _record("clock", "replaced", float(len(changed)), 0.0, not changed, detail)


def _same_code(now: Any, then: Any) -> bool:
    return now is not None and all(a is b for a, b in zip(now, then, strict=True))


def plausibility_record(
    pct_of_floor: float | None, ceilings: dict[str, float], tflops: float | None, gbps: float | None
) -> CheckRecord | None:
    """``integrity:plausibility``: the achieved rates against the machine's measured ceilings (None when the run
    has no ceilings or the job no time)."""
    if pct_of_floor is None:
        return None
    peak, bw = ceilings.get("matmul_tflops"), ceilings.get("copy_gbps")
    over = []
    if peak and tflops is not None and tflops > peak:
        over.append(f"{tflops:.3g} TFLOP/s above the measured matmul ceiling {peak:.3g} TFLOP/s")
    if bw and gbps is not None and gbps > bw:
        over.append(f"{gbps:.3g} GB/s above the measured copy ceiling {bw:.3g} GB/s")
    passed = pct_of_floor <= PLAUSIBLE_PCT_OF_FLOOR
    detail = f"{pct_of_floor:.0f}% of the roofline floor" + (": " + "; ".join(over) if over else "")
    return _record("plausibility", "pct_of_floor", pct_of_floor, PLAUSIBLE_PCT_OF_FLOOR, passed, detail)


def flag(result: Any, records: Sequence[CheckRecord]) -> None:
    """Add `records` to `result`'s verification records; a failed one makes it ``incorrect`` with no timing, its
    reason naming the defences that failed."""
    result.verification = [*result.verification, *records]
    bad = [r for r in records if r.gating and not r.passed]
    if bad:
        result.status, result.timing = "incorrect", None
        result.reason = "failed integrity: " + "; ".join(f"{r.check[len(INTEGRITY_PREFIX) :]}: {r.detail}" for r in bad)


def _tensors(out: Any) -> list[Any]:
    """The leaves of an impl's return (tuples and lists flattened; anything else kept as it is)."""
    if isinstance(out, (tuple, list)):
        return [x for item in out for x in _tensors(item)]
    return [out]


def _storage(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage().data_ptr()
    except RuntimeError:
        return -1


class _Snapshot:
    def __init__(self, index: int, factors: dict[str, float], poisoned: bool) -> None:
        self.index = index
        self.factors = factors  # the inputs' factors at this call (its inputs: the untimed copies times these)
        self.outputs: list[torch.Tensor | None] = []
        self.problem = ""
        self.poisoned = poisoned


class TimedCallGuard:
    """The per-call defences of a timed loop: a timer calls :meth:`start`, then :meth:`before` and
    :meth:`after` around each call (outside its clock readings), then :meth:`stop`; :meth:`records` judges.

    `subject` is the job's closure (``runners.closures.Subject``): its ``held`` tensors are the very ones its calls
    read, which :meth:`before` perturbs in place.
    """

    def __init__(
        self,
        impl: Any,
        case: Case,
        subject: Any,
        inputs: dict[str, Any],
        *,
        perturb: bool = True,
        device_timer: bool = False,
    ) -> None:
        self.impl, self.case, self.inputs, self.subject = impl, case, inputs, subject
        # a device timer's samples are device time, known after its batch (settle), and the loop's host time
        # outside them (launches, the L2 flush) is no sign of work moved out of the calls
        self.device_timer = device_timer
        self.spec = get_op(case.op)
        diff = {a.name for a in self.spec.inputs if a.differentiable} | {self.spec.state_arg}
        self.held = {
            n: t for n, t in subject.held.items() if n in diff and isinstance(t, torch.Tensor) and t.is_floating_point()
        }
        self.perturb = perturb and case.mode != "bwd" and bool(self.held)
        self.base = {n: t.detach().clone() for n, t in self.held.items()} if self.perturb else {}
        self._input_storages = {_storage(t) for t in subject.held.values() if isinstance(t, torch.Tensor)}
        self._input_storages |= {_storage(t) for t in inputs.values() if isinstance(t, torch.Tensor)}
        self._rng = random.SystemRandom()  # os.urandom: no state in the process to read the next draws from
        self.sample_at = {self._rng.randrange(lo, hi) for lo, hi in SAMPLE_BUCKETS}
        self.calls = 0
        self.samples_ms: list[float | None] = []
        self.snapshots: list[_Snapshot] = []
        self.new_threads: set[str] = set()
        self.poisoned = 0
        self._last: Any = None
        self._last_sampled = False
        self._poisoned_now = False
        self._returned = True  # the last call begun has returned (a call that raised leaves its poisoned input)
        self._factors: dict[str, float] = {}
        self._threads0: set[threading.Thread] = set()
        self._token: object = None
        self._state0: _hooks.InterpreterState | None = None
        self.hook_problems: set[str] = set()
        self.refused: list[str] | None = []
        self.ghost: CheckRecord | None = None
        self._span: tuple[int, int, int, int] | None = None
        self.loop_cost_ns = 0  # time spent by the guard inside the timing loop, outside the timed calls
        # Samples the timer itself left out of its timing after the loop: the CUDA timer's batches under a GPU
        # throttle (runners/hwstate.py, recorded in hardware:throttle); the timing may only lack that many.
        self.dropped = 0

    def start(self) -> None:
        """Before the first timed call: the live threads, the interpreter's hooks (the watch armed) and both
        clocks."""
        self._threads0 = set(threading.enumerate())
        self._state0 = _hooks.InterpreterState()
        self.hook_problems.update(self._state0.changes(self._state0))
        self._token = _hooks.arm()
        self._t0 = (_CLOCK_NS(), _OTHER_CLOCK_NS())

    def before(self) -> None:
        """Before call number :attr:`calls`, the same for every call: poison the previous outputs, perturb the
        inputs."""
        t0 = _CLOCK_NS()
        self._poisoned_now = self._last is not None
        self._returned = False
        if self._poisoned_now:
            self._poison(self._last)
        if self.perturb:
            self._factors = {n: self._rng.uniform(_FACTOR_LOW, _FACTOR_HIGH) for n in self.held}
            with torch.no_grad():
                for n, t in self.held.items():
                    t.copy_(self.base[n]).mul_(self._factors[n])
        self.loop_cost_ns += _CLOCK_NS() - t0

    def after(self, out: Any, ms: float | None) -> None:
        """After a call that returned `out` in `ms` milliseconds (None: a device timer's, known at :meth:`settle`):
        threads, hooks, and the copy of a sampled call's outputs (on a GPU, queued on the current stream)."""
        t0 = _CLOCK_NS()
        self.samples_ms.append(ms)
        sampled = self.calls in self.sample_at  # decided now that the call has returned
        if sampled:
            self._keep(_Snapshot(self.calls, dict(self._factors), self._poisoned_now), out)
        live = threading.enumerate()
        if len(live) != len(self._threads0) or not self._threads0.issuperset(live):
            self.new_threads |= {t.name for t in live if t not in self._threads0}
        if self._state0 is not None:
            self.hook_problems.update(_hooks.InterpreterState().changes(self._state0))
        self._last, self._last_sampled, self._returned = out, sampled, True
        self.calls += 1
        self.loop_cost_ns += _CLOCK_NS() - t0

    def settle(self, samples_ms: Sequence[float]) -> None:
        """A device timer's batch of samples, known once it synchronised: they fill the last calls' places."""
        pending = [i for i, x in enumerate(self.samples_ms) if x is None]
        for i, ms in zip(pending[-len(samples_ms) :], samples_ms, strict=False):
            self.samples_ms[i] = float(ms)

    def stop(self) -> None:
        """After the last timed call: the clocks, and the last call checked as its outputs stand now (its inputs
        rebuilt from their factors), which a result gone stale at any point of the loop cannot pass."""
        self._span = (*self._t0, _CLOCK_NS(), _OTHER_CLOCK_NS())
        t0 = _CLOCK_NS()
        self.refused = _hooks.disarm(self._token)
        if self._last is not None and self._returned and not self._last_sampled and self.perturb:
            self._keep(_Snapshot(self.calls - 1, dict(self._factors), self._poisoned_now), self._last)
        if self._last is not None and self._returned and self.impl.backend == "triton" and self.perturb:
            self.ghost = self._ghost()
        self._last = None  # the impl's last output is not kept alive past the loop
        self.loop_cost_ns += _CLOCK_NS() - t0

    def _ghost(self) -> CheckRecord:
        """``integrity:ghost`` (runners/cuda_integrity.py): one call with every Triton launch a no-op, on inputs with
        fresh factors, its outputs against the last timed call's buffers and the reference for those inputs."""
        factors = {n: self._rng.uniform(_FACTOR_LOW, _FACTOR_HIGH) for n in self.held}
        with torch.no_grad():
            for n, t in self.held.items():
                t.copy_(self.base[n]).mul_(factors[n])
        mine = {_storage(x) for x in _tensors(self._last) if isinstance(x, torch.Tensor)}
        with ghost_launches() as skipped:
            try:
                out, note = self.subject(), ""
            except Exception as exc:  # garbage from skipped kernels may break what follows them
                out, note = None, f"{type(exc).__name__}: {str(exc)[:200]}"
        if out is None:
            return ghost_record(skipped[0], False, None, 0.0, note)
        got = [x for x in _tensors(out) if isinstance(x, torch.Tensor)]
        same = bool(got) and all(_storage(x) in mine for x in got)
        snap = _Snapshot(-1, factors, False)
        ref, _ = self._reference()
        name, want = self._expected(snap, ref)[0]
        have = got[0].detach() if got else None
        if want is None or have is None or tuple(have.shape) != tuple(want.shape):
            return ghost_record(skipped[0], same, None, 0.0, "no output comparable with the reference")
        bound = threshold(self.case.dtype, name, regime=self.case.regime, numel=want.numel(), op=self.case.op,
                          dims=self.case.dims, profile=self._profile())  # fmt: skip
        return ghost_record(skipped[0], same, rel_fro(have, want), bound)

    def _profile(self) -> str:
        return "triton_interpreter" if self.impl.backend == "triton" and self.case.device == "cpu" else "native"

    def _keep(self, snap: _Snapshot, out: Any) -> None:
        """Copy `out`'s tensors into `snap` (a lazy object or a tensor subclass is a problem, never forced)."""
        for x in _tensors(out):
            if x is None:
                snap.outputs.append(None)
            elif type(x) is torch.Tensor or type(x) is torch.nn.Parameter:
                snap.outputs.append(x.detach().clone())
            else:
                snap.problem = f"call {snap.index} returned a {type(x).__name__}, not a plain tensor"
                snap.outputs.append(None)
        self.snapshots.append(snap)

    def _poison(self, out: Any) -> None:
        with torch.no_grad():
            for x in _tensors(out):
                if type(x) is torch.Tensor and x.is_floating_point() and _storage(x) not in self._input_storages:
                    x.detach().fill_(math.nan)
                    self.poisoned += 1

    # -- judging, after the loop

    def records(self, timing: TimingStats | None) -> list[CheckRecord]:
        """Every defence's record for the loop just timed (and `timing`, the summary the timer returned)."""
        t0 = _CLOCK_NS()
        recs = [self._inputs_record(), *self._recheck_records(), self._threads_record(), self._hooks_record()]
        recs.append(clock_record())
        if self.ghost is not None:
            recs.append(self.ghost)
        recs.append(self._wall_record(timing))
        loop_s, check_s = self.loop_cost_ns / 1e9, (_CLOCK_NS() - t0) / 1e9
        detail = (
            f"{loop_s + check_s:.3f} s: {loop_s:.3f} s between the timed calls (perturbing, poisoning, copying), "
            f"{check_s:.3f} s re-checking {len(self.snapshots)} calls after the loop"
        )
        recs.append(_record("cost", "seconds", loop_s + check_s, None, True, detail, gating=False))
        return recs

    def _inputs_record(self) -> CheckRecord:
        if not self.perturb:
            why = "the backward replays one forward graph" if self.case.mode == "bwd" else "no float input"
            return _record("inputs", "perturbed_calls", 0.0, None, True, f"not perturbed: {why}")
        detail = f"{', '.join(self.held)} scaled by a fresh factor in [{_FACTOR_LOW}, {_FACTOR_HIGH}) before each call"
        return _record("inputs", "perturbed_calls", float(self.calls), None, True, detail)

    def _reference(self) -> tuple[Callable[..., Any], str]:
        """The op's built-in chunked PyTorch impl in fp32 where it has one for the case's device (a re-check costs
        a kernel call, not the oracle's token loop), else the float64 oracle. A user module that registered its own
        ``torch_chunk`` over the built-in one gets the oracle."""
        from deltabench.harness.errors import UnknownImpl
        from deltabench.harness.registry import get_impl

        try:
            chunk = get_impl(self.case.op, self.spec.reference_impl)
        except UnknownImpl:
            chunk = None
        if chunk is not None and chunk.source == "builtin" and self.case.device.partition(":")[0] in chunk.devices:
            return chunk, f"{self.spec.reference_impl} fp32"
        return self.spec.oracle, "oracle"

    def _expected(self, snap: _Snapshot, ref: Callable[..., Any]) -> list[tuple[str, torch.Tensor | None]]:
        from .closures import cotangent

        with torch.no_grad():
            rebuilt = {n: self.base[n].clone().mul_(f) for n, f in snap.factors.items()}
        inputs = {**self.inputs, **{n: t.detach().clone() for n, t in self.held.items()}, **rebuilt}
        spec, case = self.spec, self.case
        if not has_backward(case.mode):
            run = call_impl(ref, spec, fp32_inputs(inputs), None)
            return [(spec.output.name, run.o), ("final_state", run.state)]
        do = cotangent(case, torch.empty(spec.output.shape(case.dims), dtype=case.torch_dtype, device=case.device))
        dht = torch.zeros(spec.state.shape(case.dims), dtype=torch.float32, device=case.device)
        run = call_impl(ref, spec, fp32_inputs(inputs), (do.float(), dht))
        names = [n for n in self.held if n in run.grads] + [n for n in run.grads if n not in self.held]
        return [(f"grad:{n}", run.grads.get(n)) for n in names]

    def _poison_record(self) -> CheckRecord:
        """Whether a sampled call's output still held the NaN put into the previous call's outputs."""
        held = [
            f"call {snap.index}: output {i}"
            for snap in self.snapshots
            if snap.poisoned
            for i, x in enumerate(snap.outputs)
            if x is not None and x.is_floating_point() and bool(torch.isnan(x).any())
        ]
        if held:
            detail = "output holds the NaN poison put into the previous call's output: " + ", ".join(held[:3])
            return _record("poison", "poisoned_outputs", float(len(held)), 0.0, False, detail)
        return _record("poison", "poisoned_outputs", 0.0, 0.0, True, f"{self.poisoned} output tensors poisoned")

    def _recheck_records(self) -> list[CheckRecord]:
        if not self.snapshots:
            return [_record("recheck", "rel_fro", None, None, True, "no timed call sampled"), self._poison_record()]
        if self.case.mode == "bwd":
            note = "not re-checked: bwd replays one graph"
            return [_record("recheck", "rel_fro", None, None, True, note), self._poison_record()]
        ref, ref_name = self._reference()
        profile = self._profile()
        worst, problems = 0.0, []
        fails: list[tuple[float, float, str]] = []
        for snap in self.snapshots:
            if snap.problem:
                problems.append(snap.problem)
                continue
            for i, (name, want) in enumerate(self._expected(snap, ref)):
                have = snap.outputs[i] if i < len(snap.outputs) else None
                if want is None:
                    continue
                if have is None or tuple(have.shape) != tuple(want.shape):
                    problems.append(f"call {snap.index}: {name} missing or of shape {getattr(have, 'shape', None)}")
                    continue
                bound = threshold(
                    self.case.dtype,
                    name,
                    profile=profile,
                    regime=self.case.regime,
                    numel=want.numel(),
                    op=self.case.op,
                    dims=self.case.dims,
                )
                err = rel_fro(have, want)
                worst = max(worst, err)
                if not err <= bound:
                    fails.append((err, bound, f"call {snap.index}: {name}"))
        calls = ", ".join(str(s.index) for s in self.snapshots)
        passed = not problems and not fails
        if passed:
            detail = f"timed calls {calls} re-checked against the {ref_name}, worst rel_fro {worst:.2e}"
        else:
            what = problems[:1] or [f"{w} rel_fro {e:.2e} > {b:.1e}" for e, b, w in fails[:2]]
            detail = f"timed calls {calls} against the {ref_name}: " + "; ".join(what)
        limit_at_worst = fails[0][1] if fails else None
        value = None if problems or not math.isfinite(worst) else worst
        recs = [_record("recheck", "rel_fro", value, limit_at_worst, passed, detail)]
        recs.append(self._poison_record())
        return recs

    def _threads_record(self) -> CheckRecord:
        names = sorted(self.new_threads)
        detail = "threads live after a timed call: " + ", ".join(names[:5]) if names else "no thread started"
        return _record("threads", "new_threads", float(len(names)), 0.0, not names, detail)

    def _hooks_record(self) -> CheckRecord:
        problems = sorted(self.hook_problems)
        if self.refused is None:
            problems.append("the interpreter watch was ended or re-armed during the loop")
        elif self.refused:
            problems.append("refused during timed calls: " + ", ".join(dict.fromkeys(self.refused)))
        detail = "; ".join(problems) or "no introspection, hook, interval timer or thread left by a timed call"
        return _record("hooks", "problems", float(len(problems)), 0.0, not problems, detail)

    def _wall_record(self, timing: TimingStats | None) -> CheckRecord:
        if self._span is None:
            return _record("wall_clock", "ratio", None, None, False, "the timed loop was never closed")
        t0, w0, t1, w1 = self._span
        span, wall = t1 - t0, w1 - w0
        problems = []
        if abs(span - wall) > _CLOCK_AGREEMENT * wall + _CLOCK_SLACK_NS:
            problems.append(f"the timer's clock spanned {span / 1e6:.1f} ms, the monotonic clock {wall / 1e6:.1f} ms")
        measured = [x for x in self.samples_ms if x is not None]
        total_ns = sum(measured) * 1e6
        if total_ns > wall + _CLOCK_SLACK_NS:
            problems.append(f"samples sum to {total_ns / 1e6:.1f} ms in a loop of {wall / 1e6:.1f} ms")
        untimed = wall - total_ns - self.loop_cost_ns
        if not self.device_timer and untimed > _UNTIMED_SHARE * total_ns + _UNTIMED_SLACK_NS:
            problems.append(
                f"{untimed / 1e6:.1f} ms of the loop outside both the timed calls ({total_ns / 1e6:.1f} ms) and the "
                "guard: work done between the calls"
            )
        if timing is not None:
            kept = [float(x) for x in timing.samples_ms]
            n = len(kept) + self.dropped
            mine = measured[-n:] if n else []
            if len(mine) != n or not _in_order(kept, mine):
                problems.append("the timing's samples are not the ones measured")
            elif kept and timing.median_ms != _MEDIAN(kept):
                problems.append(
                    f"the timing's median {timing.median_ms:.4g} ms is not its samples' {_MEDIAN(kept):.4g} ms"
                )
        ratio = span / wall if wall > 0 else None
        fine = f"timed loop {wall / 1e6:.1f} ms on both clocks, samples {total_ns / 1e6:.1f} ms"
        detail = "; ".join(problems) or fine
        return _record("wall_clock", "ratio", ratio, _CLOCK_AGREEMENT, not problems, detail)


def _in_order(kept: Sequence[float], measured: Sequence[float]) -> bool:
    """True when `kept` is `measured` with some samples left out, the rest unchanged and in their order."""
    it = iter(measured)
    return all(any(x == y for y in it) for x in kept)


_guard_defaults()
guard_functions(sys.modules[__name__], ("flag", "clock_record", "plausibility_record"))
guard_functions(TimedCallGuard, ("start", "stop", "before", "after", "records"), f"{__name__}.TimedCallGuard")
guard_functions(_hooks, ("arm", "disarm", "_refused"))
guard_functions(_hooks.InterpreterState, ("changes",), f"{_hooks.__name__}.InterpreterState")
