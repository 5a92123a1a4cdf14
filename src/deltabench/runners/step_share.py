"""A training step's mixer share: how much of one step (an op with a contract's ``training``, mode fwd+bwd) its
sequence mixer's calls take, forward and backward.

Measured inside the step, by the clock the job's timer uses (CUDA events on a GPU, the host clock on the CPU):
after the timing, a few more steps run with every mixer call wrapped (the contract's ``wrap_mixer``) in an
autograd function that reads the clock around the mixer's forward and around its backward. Events placed in the
stream time the kernels where they run, without profiler overhead or kernel-name matching, and the share is taken
over those same steps (the wrapper's own cost, a few host calls per layer, counts in both). An impl that does not
go through the op's own forward is not seen: the record says so.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from deltabench.harness.cases import Case
from deltabench.harness.document import MIXER_SHARE, CheckRecord
from deltabench.harness.ops import get_op

__all__ = ["SHARE_STEPS", "mixer_share_record", "timing_mixers"]

SHARE_STEPS = 5  # instrumented steps after the timing (the first of them also warms the wrapper's path)


class _Clock:
    """Intervals on the job's clock: CUDA event pairs on a GPU (read once, after a synchronize), else host time."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.open: list[tuple[str, Any]] = []
        self.intervals: list[tuple[str, Any, Any]] = []

    def mark(self) -> Any:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def add(self, kind: str, start: Any) -> None:
        self.intervals.append((kind, start, self.mark()))

    def totals_ms(self) -> dict[str, float]:
        if self.cuda:
            torch.cuda.synchronize()
        out: dict[str, float] = {}
        for kind, a, b in self.intervals:
            ms = a.elapsed_time(b) if self.cuda else (b - a) * 1e3
            out[kind] = out.get(kind, 0.0) + ms
        return out


class _TimedMixer(torch.autograd.Function):
    """The mixer's forward and backward, each between two readings of the clock."""

    @staticmethod
    def forward(ctx: Any, clock: _Clock, mixer: Callable[..., Any], scale: Any, *xs: Any) -> Any:
        ctx.set_materialize_grads(False)
        needs = ctx.needs_input_grad[3:]
        with torch.enable_grad():
            leaves = [None if x is None else x.detach().requires_grad_(n) for x, n in zip(xs, needs, strict=True)]
            start = clock.mark()
            o, state = mixer(*leaves[:5], scale=scale, initial_state=leaves[5])
            clock.add("mixer fwd", start)
        ctx.clock, ctx.leaves, ctx.outs = clock, leaves, (o, state)
        return o.detach(), state.detach()

    @staticmethod
    def backward(ctx: Any, *cots: Any) -> Any:
        pairs = [(t, c) for t, c in zip(ctx.outs, cots, strict=True) if c is not None and t.requires_grad]
        wrt = [x for x in ctx.leaves if x is not None and x.requires_grad]
        grads: list[Any] = []
        if pairs and wrt:
            start = ctx.clock.mark()
            grads = list(torch.autograd.grad([t for t, _ in pairs], wrt, [c for _, c in pairs], allow_unused=True))
            ctx.clock.add("mixer bwd", start)
        it = iter(grads)
        return (None, None, None, *(next(it, None) if x is not None and x.requires_grad else None for x in ctx.leaves))


def _wrapper(clock: _Clock) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def wrap(mixer: Callable[..., Any]) -> Callable[..., Any]:
        def timed(q: Any, k: Any, v: Any, g: Any, beta: Any, scale: Any = None, initial_state: Any = None) -> Any:
            return _TimedMixer.apply(clock, mixer, scale, q, k, v, g, beta, initial_state)

        return timed

    return wrap


@contextlib.contextmanager
def timing_mixers(case: Case) -> Iterator[_Clock]:
    """Within, every mixer call of `case`'s op reads the returned clock around its forward (``mixer fwd``) and its
    backward (``mixer bwd``); ``clock.totals_ms()`` sums them."""
    clock = _Clock(case.device == "cuda")
    with get_op(case.op).training.wrap_mixer(_wrapper(clock)):
        yield clock


def mixer_share_record(subject: Callable[[], Any], case: Case, steps: int = SHARE_STEPS) -> CheckRecord:
    """``mixer share`` (not gating): the mixer's forward and backward time as a percentage of `steps` training steps
    of `subject`, each on the job's clock; the milliseconds per step in its detail."""
    with timing_mixers(case) as clock:
        for _ in range(steps):
            start = clock.mark()
            subject()
            clock.add("step", start)
    ms = clock.totals_ms()
    step = ms.get("step", 0.0) / steps
    fwd, bwd = ms.get("mixer fwd", 0.0) / steps, ms.get("mixer bwd", 0.0) / steps
    seen = "mixer fwd" in ms
    pct = 100 * (fwd + bwd) / step if seen and step > 0 else None
    how = "CUDA events" if clock.cuda else "host clock"
    detail = (
        f"mixer fwd {fwd:.3f} ms + bwd {bwd:.3f} ms of a {step:.3f} ms step ({steps} instrumented steps, {how})"
        if seen
        else "not measured: the impl does not call its mixer through the op's own forward"
    )
    return CheckRecord(
        check=MIXER_SHARE,
        metric="pct_of_step",
        value=pct,
        threshold=None,
        passed=True,
        gating=False,
        reference="the instrumented steps' own time",
        detail=detail,
    )
