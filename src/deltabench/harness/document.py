"""The result document: the versioned contract between whoever measures and whoever stores and shows.

One document per run. Runners write it (``deltabench run --out results.json``), workers post it, ``db``
ingests it idempotently: a job is identified by ``(job_id, attempt)``, a run by ``run_id``, so a retried
upload never stores a result twice. Bump ``SCHEMA_VERSION`` on any incompatible change and keep reading
the older versions.

Validation is the model's own, so ingest from files, the API and the workers apply the same rules. Besides the
field types, a document must have:

- timings and samples that are finite and positive (``stdev_ms``, ``sem_rel``, ``compile_s`` finite and >= 0);
- an ``ok`` job with a timing that has samples (an imported summary, op ``pytest-benchmark``, may lack raw
  samples); a job of any other status with no timing;
- a known op (:func:`known_ops`: the built-in ones, ``pytest-benchmark``, and those registered with
  :func:`register_op_name` or the ``deltabench.ops`` entry-point group);
- a ``schema_version`` this code reads, a ``created_at`` not after now plus :data:`CLOCK_SKEW` and not before
  :data:`EARLIEST_CREATED_AT`;
- run and job ids matching :data:`ID_PATTERN` (a run id is never ``latest``, which names the newest run).

A refused document raises pydantic's ``ValidationError`` whose first error names the field and the rule.
What a store read back from older versions is rebuilt without validation (``model_construct``): see
:func:`timing_problem`, which the readers use to skip a stored timing these rules refuse.
"""

from __future__ import annotations

import datetime as _dt
import math
import uuid
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from deltabench.references import builtin_op_modules
from deltabench.references.contract import INDEXED_DIMS, order_dims, shape_id

__all__ = [
    "BUILTIN_OPS",
    "CLOCK_SKEW",
    "EARLIEST_CREATED_AT",
    "GATE_ONLY",
    "HARDWARE_CHECKS",
    "ID_PATTERN",
    "MIXER_SHARE",
    "RESERVED_RUN_IDS",
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
    "is_known_op",
    "known_ops",
    "register_op_name",
    "timing_problem",
    "unknown_op_reason",
]

# 2: CaseSpec's extra_dims, and H, K, V optional (ops with other dims); version 1 documents read unchanged.
SCHEMA_VERSION = 2
Status = Literal["ok", "incorrect", "unsupported", "oom", "timeout", "failed"]
STATUSES: tuple[str, ...] = ("ok", "incorrect", "unsupported", "oom", "timeout", "failed")
# Validation context under which an 'ok' JobResult may lack its timing: the result of a job's gate alone
# (``deltabench run --gate-workers N``), which the run times later; never a document's job.
GATE_ONLY = "gate_only"
# Run and job ids: short, printable and safe in a URL path segment (no "/", no spaces), the same everywhere.
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._+@:-]{0,127}$"
# Words the API, pages and CLI read as something other than a run id.
RESERVED_RUN_IDS = frozenset({"latest"})
# How far in the future a document's created_at may be (clocks of fleet hosts drift); a later time would make
# it the "latest" run everywhere until that time.
CLOCK_SKEW = _dt.timedelta(minutes=10)
# The earliest created_at a document may carry: no delta-rule kernel result predates 2020, and an older date (a
# clock at its epoch, a year typed as 0001) would stretch every history chart it joins across decades.
EARLIEST_CREATED_AT = _dt.datetime(2020, 1, 1, tzinfo=_dt.timezone.utc)
# The built-in ops (one per references/<op>.py, as harness/ops.py loads them) and the op of documents
# converted from pytest-benchmark files (harness/pytest_benchmark.py's EXTERNAL_OP).
BUILTIN_OPS: tuple[str, ...] = builtin_op_modules()
IMPORTED_OP = "pytest-benchmark"
_registered_ops: set[str] = set()
_fixed_ops: frozenset[str] | None = None
# Validation context key: how the reader of an unknown op's error loads ops (a command's option or the server's).
UNKNOWN_OP_REMEDY = "unknown_op_remedy"
SERVER_REMEDY = "start the server with --import FILE"
CLI_REMEDY = "give the command --import FILE"


def unknown_op_reason(op: str, remedy: str = SERVER_REMEDY) -> str:
    """The one wording of an op no contract is registered for: how to load it (`remedy`: the server's --import by
    default, :data:`CLI_REMEDY` for a command's), or its package's entry point."""
    return f"unknown op {op[:64]!r}: {remedy} or install its deltabench.ops entry point"


def register_op_name(name: str) -> None:
    """Let documents carry op `name` (a plug-in's op): call it where the plug-in registers its contract."""
    _registered_ops.add(name)


def _unregistered_ops() -> frozenset[str]:
    """The known ops that need no registration: built-in, imported summaries and entry points (read once)."""
    global _fixed_ops
    if _fixed_ops is None:
        from importlib.metadata import entry_points

        _fixed_ops = frozenset(BUILTIN_OPS) | {IMPORTED_OP} | {ep.name for ep in entry_points(group="deltabench.ops")}
    return _fixed_ops


def known_ops() -> frozenset[str]:
    """Every op a document may carry: built-in, imported summaries, registered, and ``deltabench.ops`` entry points."""
    return _unregistered_ops() | _registered_ops


def is_known_op(op: str) -> bool:
    """Whether `op` is in :func:`known_ops` (without building the set: every job of a document asks, and the union
    per job was a fiftieth of an ingest's Python time)."""
    return op in _unregistered_ops() or op in _registered_ops


def _finite(value: float, name: str, *, positive: bool) -> str | None:
    if not math.isfinite(value):
        return f"{name} must be finite, not {value}"
    if positive and value <= 0:
        return f"{name} must be positive, not {value}"
    if not positive and value < 0:
        return f"{name} must not be negative, not {value}"
    return None


def timing_problem(
    *,
    median_ms: float | None,
    samples_ms: Sequence[float] | None = None,
    q1_ms: float | None = None,
    q3_ms: float | None = None,
    mean_ms: float | None = None,
    stdev_ms: float | None = None,
    sem_rel: float | None = None,
) -> str | None:
    """Why a timing is unusable (a value missing, not finite, or not positive), or None when it is fine.

    The one definition of a valid timing: the document's validation refuses what this names, and the store's
    readers skip a stored point it names (stored by an older version that did not check).
    """
    checks: list[tuple[str, float | None, bool]] = [
        ("median_ms", median_ms, True),
        ("q1_ms", q1_ms, True),
        ("q3_ms", q3_ms, True),
        ("mean_ms", mean_ms, True),
        ("stdev_ms", stdev_ms, False),
        ("sem_rel", sem_rel, False),
    ]
    for name, value, positive in checks:
        if value is None:
            if name == "median_ms":
                return "median_ms is missing"
            continue
        problem = _finite(float(value), name, positive=positive)
        if problem:
            return problem
    samples_ms = samples_ms or ()
    # Every sample positive and finite is the common case, checked by two C loops (a NaN or an infinity makes the
    # sum so; a huge sum that overflows only sends the check to the loop): the loop below names the first bad
    # sample, and building its name per sample was a seventh of an ingest's Python time.
    if not len(samples_ms) or (min(samples_ms) > 0.0 and math.isfinite(sum(samples_ms))):
        return None
    for i, sample in enumerate(samples_ms):
        problem = _finite(float(sample), f"samples_ms[{i}]", positive=True)
        if problem:
            return problem
    return None


def _check_id(value: str) -> str:
    import re

    if not re.fullmatch(ID_PATTERN, value):
        shown = value if len(value) <= 40 else value[:40] + "..."
        raise ValueError(
            f"{shown!r} is not a valid id: use 1-128 letters, digits and ._+@:- starting with a letter or digit"
        )
    return value


Id = Annotated[str, AfterValidator(_check_id)]


_INT32 = 2**31 - 1  # the store's INTEGER columns (PostgreSQL's are 32-bit)
_INT64 = 2**63 - 1  # its BIGINT columns


def _now() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Environment(_Model):
    """Where and with what a run was measured (its fingerprint)."""

    host: str = Field(max_length=255)
    machine_kind: str = Field(
        max_length=64, description="device class used to group series, e.g. 'h200', 'cpu', 'tpu-v5e'"
    )
    device_name: str = Field(max_length=255)
    device_count: int = Field(default=1, ge=0, le=_INT32)
    platform: str = Field(default="", max_length=255)
    cpu: str = Field(default="", max_length=255)
    python: str = Field(default="", max_length=64)
    driver: str | None = Field(default=None, max_length=64)
    cuda: str | None = Field(default=None, max_length=64)
    torch: str | None = Field(default=None, max_length=64)
    triton: str | None = Field(default=None, max_length=64)
    jax: str | None = Field(default=None, max_length=64)
    deltabench: str = Field(default="", max_length=64)
    git_commit: str | None = Field(default=None, max_length=64)
    git_dirty: bool = False
    kernel_hash: str | None = Field(default=None, max_length=128, description="hash of the kernel sources the run used")
    extra: dict[str, str] = Field(default_factory=dict)


class CaseSpec(_Model):
    """One job's problem: op, dims, dtype, mode, input regime and seed.

    The delta family's dims B, T, H, K, V are fields of their own (a store indexes them); an op's other dims are
    in ``extra_dims`` and the fields of dims it lacks are None (schema version 2; version 1 has the five fields and
    no ``extra_dims``).
    """

    op: str = Field(max_length=64)
    B: int = Field(ge=1, le=_INT32)
    T: int = Field(ge=1, le=_INT32)
    H: int | None = Field(default=None, ge=1, le=_INT32)
    K: int | None = Field(default=None, ge=1, le=_INT32)
    V: int | None = Field(default=None, ge=1, le=_INT32)
    extra_dims: dict[str, int] = Field(default_factory=dict, max_length=16, description="dims besides B,T,H,K,V")
    dtype: Literal["fp32", "bf16", "fp16"]
    mode: Literal["fwd", "fwd+bwd", "bwd", "decode"] = "fwd"
    regime: str = Field(default="typical", max_length=16, pattern=r"^[a-z][a-z0-9_]*$")
    seed: int = Field(default=0, ge=-_INT64 - 1, le=_INT64)
    initial_state: bool = False
    seqlens: list[int] | None = Field(
        default=None, min_length=1, max_length=1 << 20, description="packed sequences' lengths (B = 1, sum = T)"
    )
    seqlens_from: str = Field(default="", max_length=128, description="the distribution the lengths were drawn from")

    @field_validator("op")
    @classmethod
    def _known_op(cls, op: str, info: ValidationInfo) -> str:
        if not is_known_op(op):
            raise ValueError(unknown_op_reason(op, (info.context or {}).get(UNKNOWN_OP_REMEDY, SERVER_REMEDY)))
        return op

    @field_validator("extra_dims")
    @classmethod
    def _extra_dims(cls, dims: dict[str, int]) -> dict[str, int]:
        import re

        for name, size in dims.items():
            if not re.fullmatch(r"[A-Z]{1,8}", name) or name in INDEXED_DIMS:
                raise ValueError(f"extra dim {name[:16]!r}: upper-case letters, none of {', '.join(INDEXED_DIMS)}")
            if not 1 <= size <= _INT32:
                raise ValueError(f"extra dim {name} = {size}: must be between 1 and {_INT32}")
        return dims

    @classmethod
    def from_dims(cls, op: str, dims: dict[str, int], **fields: Any) -> CaseSpec:
        """The document's case of `op` at `dims` (any names): the indexed ones as fields, the others as extra dims."""
        indexed = {d: v for d, v in dims.items() if d in INDEXED_DIMS}
        extra = {d: v for d, v in dims.items() if d not in INDEXED_DIMS}
        return cls(op=op, **indexed, extra_dims=extra, **fields)

    @property
    def dims(self) -> dict[str, int]:
        """Every dim the case has, indexed ones first (references/contract.order_dims)."""
        indexed = {d: getattr(self, d) for d in INDEXED_DIMS if getattr(self, d) is not None}
        return order_dims({**indexed, **(self.extra_dims or {})})

    @property
    def shape_id(self) -> str:
        """``B8-T4096-H6-K128-V128`` (``B2-T100-D8`` for an op of dims B, T, D); packed sequences add their count
        and distribution, as harness/cases.Case.shape_id spells them."""
        return shape_id(self.dims, self.seqlens, self.seqlens_from)


# The verification records of a job's GPU state while it was timed (runners/hwstate.py); they never gate.
HARDWARE_CHECKS = ("hardware:clocks", "hardware:throttle")
# The check name of a training step's mixer share (runners/step_share.py), a reported record: the report's column.
MIXER_SHARE = "mixer share"


class CheckRecord(_Model):
    """One verification check: a metric against its threshold."""

    check: str = Field(
        max_length=64, description="e.g. 'output', 'final_state', 'grad:q', 'streaming', 'finite', 'determinism'"
    )
    metric: str = Field(max_length=32, description="e.g. 'rel_fro', 'max_abs', 'bitwise'")
    value: float | None
    threshold: float | None
    passed: bool
    gating: bool = True
    worst_index: list[int] | None = None
    seed: int | None = Field(default=None, ge=-_INT64 - 1, le=_INT64)
    regime: str | None = Field(default=None, max_length=16)
    initial_state: bool | None = None
    reference: str = "oracle"
    detail: str = ""

    @property
    def where(self) -> str:
        """Where the check ran, in words: its seed, regime and variant (with or without an initial state), e.g.
        ``seed 0, regime long, initial state``; empty when the record names none."""
        state = {True: "initial state", False: "zero state", None: ""}[self.initial_state]
        seed = "" if self.seed is None else f"seed {self.seed}"
        regime = f"regime {self.regime}" if self.regime else ""
        return ", ".join(x for x in (seed, regime, state) if x)


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
    warmup: int = Field(default=0, ge=0, le=_INT32)
    l2_flush: bool = False
    compile_s: float | None = Field(
        default=None, ge=0, allow_inf_nan=False, description="compilation and autotuning before the first sample"
    )
    stop_reason: str = ""
    repetitions: list[int] = Field(
        default_factory=list,
        description="the repetition (0, 1, ...) each sample was measured in, parallel to samples_ms "
        "(`deltabench run --repeat N`: one worker process per repetition); empty: one repetition",
    )

    @model_validator(mode="after")
    def _finite_positive(self) -> TimingStats:
        problem = timing_problem(
            median_ms=self.median_ms,
            samples_ms=self.samples_ms,
            q1_ms=self.q1_ms,
            q3_ms=self.q3_ms,
            mean_ms=self.mean_ms,
            stdev_ms=self.stdev_ms,
            sem_rel=self.sem_rel,
        )
        if problem:
            raise ValueError(f"a timing must be finite and positive: {problem}")
        if self.repetitions and len(self.repetitions) != len(self.samples_ms):
            raise ValueError(
                f"repetitions names {len(self.repetitions)} samples' repetitions for {len(self.samples_ms)} samples"
            )
        if any(r < 0 or r > _INT32 for r in self.repetitions):
            raise ValueError("a repetition index is a non-negative integer")
        return self

    @property
    def n_repetitions(self) -> int:
        """How many repetitions (worker processes) the samples come from: 1 without repetition indices."""
        return len(set(self.repetitions)) if self.repetitions else 1

    @property
    def iqr_ms(self) -> float:
        """Inter-quartile range."""
        return self.q3_ms - self.q1_ms


class MemoryStats(_Model):
    """Peak device memory of the timed call, net of its inputs."""

    peak_bytes: int = Field(ge=0, le=_INT64)
    inputs_bytes: int = Field(default=0, ge=0, le=_INT64)
    method: str = ""


class WorkFigures(_Model):
    """Work done and how close to the machine's ceilings it ran."""

    flops: float = Field(ge=0, allow_inf_nan=False)
    bytes: float = Field(ge=0, allow_inf_nan=False)
    tflops: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    gbps: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    floor_ms: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    pct_of_floor: float | None = Field(default=None, ge=0, allow_inf_nan=False, description="100 * floor / measured")
    # A decode step's figures (mode decode): its time per step, new tokens per second, the state's traffic (read
    # and written once) per second and as a share of the machine's measured copy ceiling. A training step (lm_step,
    # fwd+bwd) has tokens_per_s too: its B*T tokens per second.
    us_per_step: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    tokens_per_s: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    state_gbps: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    pct_of_copy: float | None = Field(default=None, ge=0, allow_inf_nan=False, description="100 * state_gbps / copy")


class JobResult(_Model):
    """One (case, impl) job's outcome. A failure is a result, with its reason."""

    job_id: Id = Field(default_factory=lambda: uuid.uuid4().hex)
    attempt: int = Field(default=1, ge=1, le=_INT32)
    case: CaseSpec
    impl: str = Field(min_length=1, max_length=512)
    backend: str = Field(default="", max_length=64)
    device: str = Field(default="cpu", max_length=64)
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

    @property
    def integrity(self) -> list[CheckRecord]:
        """The integrity records among :attr:`verification` (``integrity:<defence>``, runners/integrity.py)."""
        return [r for r in self.verification if r.check.startswith("integrity:")]

    @model_validator(mode="after")
    def _timing_matches_status(self, info: ValidationInfo) -> JobResult:
        if self.status == "ok":
            if self.timing is None and (info.context or {}).get(GATE_ONLY):
                return self  # a gate-only run's result (runners/isolated.py run_gates): passed, not yet timed
            if self.timing is None:
                raise ValueError("status 'ok' needs a timing (a job that passed the gate was timed)")
            if not self.timing.samples_ms and self.case.op != IMPORTED_OP:
                raise ValueError("status 'ok' needs a timing with samples (samples_ms is empty)")
        elif self.timing is not None:
            raise ValueError(f"status {self.status!r} carries no timing (only an 'ok' job has a valid timing)")
        return self


class ResultDocument(_Model):
    """One run: environment, suite, the machine's ceilings and every job."""

    schema_version: int = Field(
        default=SCHEMA_VERSION, ge=1, le=SCHEMA_VERSION, description="a version this code reads"
    )
    run_id: Id = Field(default_factory=lambda: uuid.uuid4().hex)
    created_at: _dt.datetime = Field(default_factory=_now)
    suite: str = Field(default="", max_length=255)
    baselines: dict[str, str] = Field(default_factory=dict, description="baseline impl per op")
    environment: Environment
    ceilings: dict[str, float] = Field(
        default_factory=dict, description="measured once per machine: 'matmul_tflops', 'copy_gbps'"
    )
    jobs: list[JobResult] = Field(default_factory=list)
    meta: dict[str, Any] = Field(default_factory=dict)

    @field_validator("run_id")
    @classmethod
    def _not_reserved(cls, run_id: str) -> str:
        if run_id in RESERVED_RUN_IDS:
            raise ValueError(f"{run_id!r} is reserved (it names the newest run), not a run id")
        return run_id

    @field_validator("created_at")
    @classmethod
    def _within_bounds(cls, created_at: _dt.datetime) -> _dt.datetime:
        aware = created_at if created_at.tzinfo else created_at.replace(tzinfo=_dt.timezone.utc)
        if aware < EARLIEST_CREATED_AT:
            raise ValueError(
                f"created_at {aware.isoformat()} is before {EARLIEST_CREATED_AT.date().isoformat()}, the earliest "
                "date a document may carry"
            )
        latest = _now() + CLOCK_SKEW
        if aware > latest:
            raise ValueError(
                f"created_at {aware.isoformat()} is in the future (more than {CLOCK_SKEW} after now, "
                f"{_now().isoformat(timespec='seconds')})"
            )
        return created_at

    @property
    def complete(self) -> bool:
        """False for a run cut short (``meta.complete`` false: its document was saved before every job ran)."""
        return self.meta.get("complete", True) is not False

    def to_json(self) -> str:
        """Serialise (indented) for a file or an upload."""
        return self.model_dump_json(indent=1)

    @classmethod
    def from_json(cls, text: str | bytes) -> ResultDocument:
        """Parse and validate a document."""
        return cls.model_validate_json(text)
