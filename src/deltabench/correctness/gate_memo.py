"""The gate's reduced-case records, made once per run in a worker process and reused by its later jobs.

Part of the correctness gate runs at cases cut down from the job's: the float64 oracle at ``B=1, T<=SHORT_T`` and
the length sweep (``B=1``, a few short lengths). Their records depend on the impl, the code it runs, the op, dtype,
mode, the dims other than B and T, the seeds and regimes, never on the job's B and T; a worker process running one
impl's jobs at several B and T would remake them identically in every job. :class:`GateMemo` keeps them for the
process's life, for the jobs of one run only (its ``scope``: the run and a hash of the kernel sources), and hands
back a reused record with its ``detail`` saying so and naming the job that made it: a document never passes a job
on a check it did not make without saying where the check came from. A failed record is reused as failed.

A fresh process (after a crash, a timeout, or with ``isolation = "job"``) starts with an empty memo and recomputes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable

from deltabench.harness.document import CheckRecord

__all__ = ["REUSED_MARK", "GateMemo", "reused_from"]

REUSED_MARK = "reused from job "  # how a reused record's detail begins


def reused_from(record: CheckRecord) -> str | None:
    """The job id a reused record was made by, or None when the job made it itself."""
    if not record.detail.startswith(REUSED_MARK):
        return None
    return record.detail[len(REUSED_MARK) :].split(" ", 1)[0]


@dataclasses.dataclass
class GateMemo:
    """Records of reduced-case checks already made in this process, by key, within one scope (see the module
    docstring). :meth:`enter` starts a job; :meth:`records` returns a check's records, made or reused."""

    scope: Hashable = None
    made_by: str = ""
    _entries: dict[Hashable, tuple[str, list[CheckRecord]]] = dataclasses.field(default_factory=dict)

    def enter(self, scope: Hashable, made_by: str) -> None:
        """Start a job, `made_by` (its id): records kept under another scope (an earlier run) are dropped."""
        if scope != self.scope:
            self._entries.clear()
            self.scope = scope
        self.made_by = made_by

    def records(self, key: Hashable, make: Callable[[], list[CheckRecord]]) -> list[CheckRecord]:
        """The records of the check `key`: reused (marked) when a job of this scope made them, else made now by
        `make()` and kept. An exception in `make` keeps nothing."""
        hit = self._entries.get(key)
        if hit is not None:
            maker, kept = hit
            return [_mark(r, maker) for r in kept]
        made = make()
        self._entries[key] = (self.made_by, [r.model_copy() for r in made])
        return made

    def __len__(self) -> int:
        return len(self._entries)


def _mark(record: CheckRecord, maker: str) -> CheckRecord:
    note = f"{REUSED_MARK}{maker} (an identical check earlier in this run)"
    return record.model_copy(update={"detail": f"{note}; {record.detail}" if record.detail else note})
