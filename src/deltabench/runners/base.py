"""What a runner is given and what it returns: a :class:`JobSpec` in, a JobResult out.

A job is one (case, impl) pair with the settings of its suite. :class:`Runner` is the one-method
interface every execution strategy implements: in this process (:mod:`.job`, used inside the job's
subprocess) or isolated in subprocesses with a timeout, a worker per impl or a fresh one per job
(:mod:`.isolated`).
"""

from __future__ import annotations

import uuid
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from deltabench.harness.cases import Case
from deltabench.harness.document import JobResult
from deltabench.harness.suites import GateSettings, TimingSettings

__all__ = ["GateSettings", "JobSpec", "Runner", "TimingSettings"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class JobSpec(_Model):
    """One job, as sent to a runner (and, as JSON, to the job's subprocess)."""

    job_id: str = Field(default_factory=lambda: uuid.uuid4().hex)
    attempt: int = 1
    case: dict[str, Any]
    impl: str
    imports: list[str] = Field(default_factory=list, description="user modules that register impls")
    timing: TimingSettings = Field(default_factory=TimingSettings)
    gate: GateSettings = Field(default_factory=GateSettings)
    timeout_s: float = Field(default=900.0, gt=0)
    run_id: str | None = Field(
        default=None,
        max_length=64,
        description="the run the job belongs to (set by the runner): a worker process reuses the gate's reduced-case "
        "records across the jobs of one run only (correctness/gate_memo.py); None: nothing is reused",
    )
    drawn_seed: int | None = Field(
        default=None,
        ge=0,
        description="the gate's extra seed, drawn once by the runner for every job of the run (the document's "
        "meta `gate_drawn_seed`); None: the job draws its own when its gate asks for one",
    )
    repetition: int = Field(
        default=0,
        ge=0,
        description="which repetition of the job this is (`deltabench run --repeat N`); repetitions after the "
        "first skip the correctness gate, which the first passed with the same code in the same run",
    )
    stage: Literal["all", "gate", "after_gate", "compile"] = Field(
        default="all",
        description="what of the job this process runs (`deltabench run --gate-workers N`): everything, its gate "
        "only (setup, first call, gate; ok = passed, no timing), all but the gate, which a gate-only run of the "
        "same job passed in this run, or the calls its gate makes at the job's shape, unchecked (ok = they "
        "returned): an impl that compiles each shape compiles the gate's shapes side by side before its gates",
    )

    compile_cases: list[dict[str, Any]] = Field(
        default_factory=list,
        description="stage compile: the further cases (besides `case`) whose gate calls this job makes, for an "
        "impl whose kernels a dry run lists (``Impl.jit``): its kernels for all of them are built side by side",
    )

    @classmethod
    def for_case(cls, case: Case, impl: str, **settings: Any) -> JobSpec:
        """A job for `case` and impl `impl`."""
        return cls(case=case.to_dict(), impl=impl, **settings)

    def to_case(self) -> Case:
        """The job's :class:`Case`."""
        return Case(**self.case)


class Runner(Protocol):
    """Runs a job and returns its result; a failure is a result (status and reason), never an exception."""

    def run(self, job: JobSpec) -> JobResult:
        """Run `job`."""
        ...
