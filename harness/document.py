"""The result document: the versioned contract between whoever measures and whoever stores and shows.

One document per run. Runners write it (``deltabench run --out results.json``), workers post it, ``db``
ingests it idempotently: a job is identified by ``(job_id, attempt)``, a run by ``run_id``, so a retried
upload never stores a result twice. Bump ``SCHEMA_VERSION`` on any incompatible change and keep reading
the older versions.
"""

from __future__ import annotations

import datetime as _dt
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "SCHEMA_VERSION",
    "STATUSES",
    "CaseSpec",
    "CheckRecord",
    "Environment",
    "JobResult",
    "MemoryStats",
    "ResultDocument",
    "TimingStats",
    "WorkFigures",
]

SCHEMA_VERSION = 1
Status = Literal["ok", "incorrect", "unsupported", "oom", "timeout", "failed"]
STATUSES: tuple[str, ...] = ("ok", "incorrect", "unsupported", "oom", "timeout", "failed")


def _now() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Environment(_Model):
    """Where and with what a run was measured (its fingerprint)."""

    host: str
    machine_kind: str = Field(description="device class used to group series, e.g. 'h200', 'cpu', 'tpu-v5e'")
    device_name: str
    device_count: int = 1
    platform: str = ""
    cpu: str = ""
    python: str = ""
    driver: str | None = None
    cuda: str | None = None
    torch: str | None = None
    triton: str | None = None
    jax: str | None = None
    deltabench: str = ""
    git_commit: str | None = None
    git_dirty: bool = False
    kernel_hash: str | None = Field(default=None, description="hash of the kernel sources the run used")
    extra: dict[str, str] = Field(default_factory=dict)


class CaseSpec(_Model):
    """One job's problem: op, dims, dtype, mode, gate regime and seed."""

    op: str
    B: int = Field(ge=1)
    T: int = Field(ge=1)
    H: int = Field(ge=1)
    K: int = Field(ge=1)
    V: int = Field(ge=1)
    dtype: Literal["fp32", "bf16", "fp16"]
    mode: Literal["fwd", "fwd+bwd", "bwd"] = "fwd"
    regime: Literal["typical", "long", "strong"] = "typical"
    seed: int = 0
    initial_state: bool = False

    @property
    def shape_id(self) -> str:
        """``B8-T4096-H6-K128-V128``."""
        return f"B{self.B}-T{self.T}-H{self.H}-K{self.K}-V{self.V}"


class CheckRecord(_Model):
    """One verification check: a metric against its threshold."""

    check: str = Field(description="e.g. 'output', 'final_state', 'grad:q', 'streaming', 'finite', 'determinism'")
    metric: str = Field(description="e.g. 'rel_fro', 'max_abs', 'bitwise'")
    value: float | None
    threshold: float | None
    passed: bool
    gating: bool = True
    worst_index: list[int] | None = None
    seed: int | None = None
    regime: str | None = None
    initial_state: bool | None = None
    reference: str = "oracle"
    detail: str = ""


class TimingStats(_Model):
    """Timing of one job: every raw sample, and its summary (milliseconds)."""

    clock: Literal["cuda_events", "cuda_graph", "cpu_monotonic", "jax"] = "cpu_monotonic"
    samples_ms: list[float]
    median_ms: float
    q1_ms: float
    q3_ms: float
    mean_ms: float
    stdev_ms: float
    sem_rel: float = Field(description="standard error of the estimate over the estimate")
    warmup: int = 0
    l2_flush: bool = False
    compile_s: float | None = Field(default=None, description="compilation and autotuning before the first sample")
    stop_reason: str = ""

    @property
    def iqr_ms(self) -> float:
        """Inter-quartile range."""
        return self.q3_ms - self.q1_ms


class MemoryStats(_Model):
    """Peak device memory of the timed call, net of its inputs."""

    peak_bytes: int
    inputs_bytes: int = 0
    method: str = ""


class WorkFigures(_Model):
    """Work done and how close to the machine's ceilings it ran."""

    flops: float
    bytes: float
    tflops: float | None = None
    gbps: float | None = None
    floor_ms: float | None = None
    pct_of_floor: float | None = Field(default=None, description="100 * floor / measured")


class JobResult(_Model):
    """One (case, impl) job's outcome. A failure is a result, with its reason."""

    job_id: str = Field(default_factory=lambda: uuid.uuid4().hex)
    attempt: int = 1
    case: CaseSpec
    impl: str
    backend: str = ""
    device: str = "cpu"
    status: Status
    reason: str = ""
    gate_reference: str = Field(default="oracle", description="what the gate compared against at this shape")
    verification: list[CheckRecord] = Field(default_factory=list)
    timing: TimingStats | None = None
    memory: MemoryStats | None = None
    work: WorkFigures | None = None
    notes: str = ""
    started_at: _dt.datetime = Field(default_factory=_now)
    finished_at: _dt.datetime | None = None


class ResultDocument(_Model):
    """One run: environment, suite, the machine's ceilings and every job."""

    schema_version: int = SCHEMA_VERSION
    run_id: str = Field(default_factory=lambda: uuid.uuid4().hex)
    created_at: _dt.datetime = Field(default_factory=_now)
    suite: str = ""
    baselines: dict[str, str] = Field(default_factory=dict, description="baseline impl per op")
    environment: Environment
    ceilings: dict[str, float] = Field(
        default_factory=dict, description="measured once per machine: 'matmul_tflops', 'copy_gbps'"
    )
    jobs: list[JobResult] = Field(default_factory=list)
    meta: dict[str, Any] = Field(default_factory=dict)

    def to_json(self) -> str:
        """Serialise (indented) for a file or an upload."""
        return self.model_dump_json(indent=1)

    @classmethod
    def from_json(cls, text: str | bytes) -> ResultDocument:
        """Parse and validate a document."""
        return cls.model_validate_json(text)
