"""`deltabench run`'s progress for a log: one plain line per gate and per job, where no one watches a live bar.

A run of a GPU suite written to a file (a CI job, a device session's log) otherwise shows nothing between its start
and its tables; these lines say which job or gate chain it is in and how long each took, so a run cut short still
tells where its time went.
"""

from __future__ import annotations

import time

from rich.console import Console

from deltabench.harness.document import JobResult

__all__ = ["ProgressLines"]


class ProgressLines:
    """Timestamped lines on `console` (stderr), each printed whole as it is made."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.start = time.monotonic()

    def line(self, text: str) -> None:
        """Print `text` after the seconds since the run began, with no markup or wrapping."""
        self.console.print(
            f"{time.monotonic() - self.start:7.1f} s  {text}", markup=False, highlight=False, soft_wrap=True
        )

    @staticmethod
    def outcome(result: JobResult, took_s: float | None = None) -> str:
        """`result` in a few words: its status, its median where timed, its reason's first line otherwise, and how
        long it took: `took_s` when given (one repetition of a job, whose result spans every repetition so far),
        else the result's own span."""
        took = ""
        if took_s is not None:
            took = f" in {took_s:.1f} s"
        elif result.finished_at is not None:
            took = f" in {(result.finished_at - result.started_at).total_seconds():.1f} s"
        if result.status == "ok":
            median = f", median {result.timing.median_ms:.3g} ms" if result.timing is not None else ""
            return f"ok{median}{took}{ProgressLines.gate_stages(result)}"
        reason = result.reason.splitlines()[0][:160] if result.reason else ""
        return f"{result.status}{took}" + (f": {reason}" if reason else "")

    @staticmethod
    def gate_stages(result: JobResult, *, at_least_s: float = 30.0, stages: int = 3) -> str:
        """`result`'s longest gate stages (its ``gate time`` record), as `` [gate: stage 12.0 s, ...]``, where its
        gate took `at_least_s` or more; empty otherwise."""
        note = next((r for r in reversed(result.verification) if r.check == "gate time"), None)
        if note is None:
            return ""
        total, _, parts = note.detail.partition(" s: ")
        try:
            if float(total) < at_least_s:
                return ""
        except ValueError:
            return ""
        return " [gate: " + ", ".join(parts.split(", ")[:stages]) + "]"
