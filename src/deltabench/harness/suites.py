"""Suites: named sets of benchmark jobs, written in TOML.

A suite lists ops, and per op its impls, a baseline impl, shapes, dtypes and modes; settings at the top
level apply to every op unless the op overrides them. Shipped suites live in ``suites/*.toml``
(``deltabench run --suite smoke``); a user's suite is given by path. Example::

    name = "mine"
    description = "my kernel against the chunked reference"
    device = "cuda"                       # optional: cpu, cuda or tpu; `deltabench run --device` overrides it
    shapes = ["B=8,T=4096,H=6,K=128,V=128"]
    dtypes = ["bf16"]
    modes = ["fwd", "fwd+bwd"]            # fwd, fwd+bwd, bwd, decode
    timeout_s = 900                       # per job
    isolation = "impl"                    # "impl": the jobs of one impl share one process, one after another
                                          #   (a timeout, crash, OOM or failure ends it; the next job gets a
                                          #   fresh one); "job": a fresh process per job, for leaky kernels
    regime = "typical"                    # the gate's input regime; optional
    [timing]                              # optional: TimingSettings (defaults: runners.timing.TimingDefaults)
    budget_s = 2.0
    [gate]                                # optional: runners.base.GateSettings
    seeds = 3
    regimes = ["typical", "long"]         # the gate's regimes (default: every regime of each op)
    workers = 4                           # gate every job first, up to 4 at once, each in its own process;
                                          #   then time them one at a time (default 1: each job gated right
                                          #   before its timing); `deltabench run --gate-workers` overrides it
    [ops.gdn]
    impls = ["torch_chunk", "my_chunk"]
    baseline = "torch_chunk"
    shapes = [{B = 1, T = 1024, H = 6, K = 128}]   # a string or a table; V defaults to K
    # packed sequences (cu_seqlens; a table with B = 1): lengths summing to T, or a distribution drawn once,
    # recorded with the lengths it gave
    #   {B = 1, T = 300, H = 2, K = 32, seqlens = [17, 64, 1, 218]}
    #   {B = 1, T = 32768, H = 16, K = 128, seqlens = "lognormal(mean=2048, sigma=1.0, total=32768, seed=0)"}

Jobs are expanded op by op, then shape, dtype, mode and impl, so that a table reads in that order.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from .cases import MODES, REGIMES, Case, parse_dtype, parse_shape
from .devices import parse_platform
from .errors import BadInput
from .seqlens import draw_seqlens
from .timing_defaults import TIMING_DEFAULTS as _DEFAULTS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = [
    "ISOLATIONS",
    "SUITES_DIR",
    "GateSettings",
    "OpPlan",
    "Suite",
    "TimingSettings",
    "load_suite",
    "parse_suite",
    "shipped_suites",
]

SUITES_DIR = Path(__file__).resolve().parent.parent / "suites"
_TOP_KEYS = {
    "name",
    "description",
    "device",
    "shapes",
    "dtypes",
    "modes",
    "timeout_s",
    "isolation",
    "regime",
    "initial_state",
    "seed",
    "timing",
    "gate",
    "ops",
}
_OP_KEYS = {"impls", "baseline", "shapes", "dtypes", "modes"}
ISOLATIONS = ("impl", "job")  # how jobs share processes (runners.isolated.make_runner)


class _Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TimingSettings(_Settings):
    """How long and how precisely to time a job (a suite's ``[timing]`` table); each unset field is the shared
    default (``harness.timing_defaults.TIMING_DEFAULTS``)."""

    budget_s: float = Field(default=_DEFAULTS.budget_s, gt=0, description="time budget for the repetitions")
    target_sem: float = Field(
        default=_DEFAULTS.target_sem, gt=0, description="stop once SE(median)/median is below this"
    )
    min_reps: int = Field(default=_DEFAULTS.min_reps, ge=1)
    max_reps: int = Field(default=_DEFAULTS.max_reps, ge=1)
    warmup_s: float = Field(default=_DEFAULTS.warmup_s, ge=0, description="cap on warm-up time after the first call")
    l2_flush: bool = Field(default=_DEFAULTS.l2_flush, description="CUDA: flush L2 before each sample")
    cuda_graph: bool = Field(default=_DEFAULTS.cuda_graph, description="CUDA: time graph replays of several calls")
    cpu_threads: int | None = Field(
        default=None, ge=1, description="CPU: torch intra-op threads for the job (default: torch's own choice)"
    )


class GateSettings(_Settings):
    """The correctness gate's options (a suite's ``[gate]`` table), passed to ``verify_case``."""

    seeds: int = Field(default=3, ge=1)
    extra_seed: bool = True
    gate_determinism: bool = False
    reference: str = "auto"
    regimes: tuple[str, ...] | None = Field(
        default=None, min_length=1, description="the gate's input regimes (default: every regime of the op)"
    )
    integrity: bool = Field(
        default=True,
        description="the timed calls' integrity defences (runners/integrity.py): perturbed inputs, re-checked "
        "outputs, poisoned buffers, idle threads, the clock's identity and its cross-check",
    )


@dataclasses.dataclass(frozen=True)
class OpPlan:
    """One op of a suite: its impls, baseline and the grid of shapes, dtypes and modes."""

    op: str
    impls: tuple[str, ...]
    baseline: str
    shapes: tuple[dict[str, Any], ...]  # dims, and packed sequences' seqlens and seqlens_from where given
    dtypes: tuple[str, ...]
    modes: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Suite:
    """A parsed, validated suite."""

    name: str
    description: str
    ops: tuple[OpPlan, ...]
    device: str | None = None
    timeout_s: float | None = None
    isolation: str = "impl"
    regime: str = "typical"
    initial_state: bool = False
    seed: int = 0
    timing: dict[str, Any] = dataclasses.field(default_factory=dict)
    gate: dict[str, Any] = dataclasses.field(default_factory=dict)
    source: str = ""
    gate_workers: int = 1  # [gate] workers: how many jobs' gates run at once before any timing (module docstring)

    @property
    def baselines(self) -> dict[str, str]:
        """Baseline impl per op."""
        return {p.op: p.baseline for p in self.ops}

    def jobs(
        self,
        *,
        device: str,
        impls: list[str] | None = None,
        ops: list[str] | None = None,
        shapes: list[str] | None = None,
        modes: list[str] | None = None,
    ) -> list[tuple[Case, str]]:
        """The suite's (case, impl) jobs on `device`, optionally only some impls (in the order of `impls`), ops,
        shapes (as a suite writes them, e.g. ``B=1,T=8192,H=2,K=128``, read by each op's dims) and modes: a suite
        run in parts, each part's document then merged (``benchmarks/merge_runs.py``).

        Raises BadInput when a filter names nothing in the suite.
        """
        for name, wanted, known in (
            ("op", ops, {p.op for p in self.ops}),
            ("impl", impls, {i for p in self.ops for i in p.impls}),
            ("mode", modes, {m for p in self.ops for m in p.modes}),
        ):
            unknown = sorted(set(wanted or ()) - known)
            if unknown:
                raise BadInput(
                    f"suite {self.name!r} has no {name} {', '.join(map(repr, unknown))}: "
                    f"it has {', '.join(sorted(known))}"
                )
        wanted_shapes = self._wanted_shapes(shapes) if shapes else None
        out = []
        for plan in self.ops:
            if ops and plan.op not in ops:
                continue
            # impls named by the caller run in the caller's order (a run cut short then has the first ones)
            order = [i for i in dict.fromkeys(impls) if i in plan.impls] if impls else list(plan.impls)
            for dims in plan.shapes:
                if wanted_shapes is not None and dims_only(dims) not in wanted_shapes[plan.op]:
                    continue
                for dtype in plan.dtypes:
                    for mode in plan.modes:
                        if modes and mode not in modes:
                            continue
                        for impl in order:
                            case = Case(
                                op=plan.op,
                                **dims,
                                dtype=dtype,
                                seed=self.seed,
                                regime=self.regime,
                                initial_state=self.initial_state,
                                mode=mode,
                                device=device,
                            )
                            out.append((case, impl))
        return out

    def packed(self, seqlens: tuple[int, ...]) -> Suite:
        """The suite with its shapes of B = 1 and T = ``sum(seqlens)`` packing those sequences, its other shapes
        (and ops that take no packed sequences) left out; BadInput when no shape is left."""
        from .ops import get_op

        T = sum(seqlens)
        plans = []
        for plan in self.ops:
            if not get_op(plan.op).varlen:
                continue
            shapes = tuple({**dims_only(s), "seqlens": seqlens} for s in plan.shapes if s["B"] == 1 and s["T"] == T)
            if shapes:
                plans.append(dataclasses.replace(plan, shapes=shapes))
        if not plans:
            have = sorted({f"B={s['B']},T={s['T']}" for p in self.ops for s in p.shapes})
            raise BadInput(
                f"--seqlens sum to T={T}: suite {self.name!r} has no shape B=1,T={T} (it has {', '.join(have)})"
            )
        return dataclasses.replace(self, ops=tuple(plans))

    def _wanted_shapes(self, shapes: list[str]) -> dict[str, list[dict[str, int]]]:
        """Per op, the suite's shapes among `shapes` (each read by that op's dims; one an op cannot read is not
        its). Raises BadInput for a shape no op of the suite has, naming the suite's shapes."""
        wanted: dict[str, list[dict[str, int]]] = {p.op: [] for p in self.ops}
        for text in shapes:
            found = False
            for plan in self.ops:
                try:
                    dims = parse_shape(text, plan.op)
                except BadInput:
                    continue
                if dims in [dims_only(x) for x in plan.shapes]:
                    wanted[plan.op].append(dims)
                    found = True
            if not found:
                known = sorted({",".join(f"{k}={v}" for k, v in d.items()) for p in self.ops for d in p.shapes})
                raise BadInput(f"suite {self.name!r} has no shape {text!r}: it has {'; '.join(known)}")
        return wanted


def shipped_suites() -> list[str]:
    """Names of the suites shipped with deltabench."""
    return sorted(p.stem for p in SUITES_DIR.glob("*.toml"))


def _list(value: Any, what: str, where: str) -> list[Any]:
    if isinstance(value, (str, dict)):
        value = [value]
    if not isinstance(value, list) or not value:
        raise BadInput(f"{where}: {what} must be a non-empty list")
    return value


def _shape(value: Any, where: str, op: str | None = None) -> dict[str, Any]:
    """A suite's shape: its dims, and for packed sequences ``seqlens`` (and ``seqlens_from`` when drawn)."""
    if isinstance(value, dict) and "seqlens" in value:
        rest = {k: v for k, v in value.items() if k != "seqlens"}
        dims = _shape(rest, where, op)
        return {**dims, **_packed(value["seqlens"], dims, where, op)}
    if isinstance(value, dict):
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in value.values()):
            raise BadInput(f"{where}: shape {value!r} must map dimensions to integers")
        value = ",".join(f"{k}={v}" for k, v in value.items())
    if not isinstance(value, str):
        raise BadInput(f"{where}: a shape is a string like 'B=2,T=200,H=4,K=64,V=64' or a table, not {value!r}")
    try:
        return parse_shape(value, op)
    except BadInput as exc:
        raise BadInput(f"{where}: {exc}") from None


def _packed(value: Any, dims: dict[str, int], where: str, op: str | None) -> dict[str, Any]:
    """``seqlens`` of a suite's shape (a list of lengths or a distribution's spelling) as Case fields, checked."""
    if isinstance(value, str):
        try:
            lengths, drawn = draw_seqlens(value, dims.get("T"))
        except BadInput as exc:
            raise BadInput(f"{where}: {exc}") from None
    elif isinstance(value, list) and value and all(isinstance(n, int) and not isinstance(n, bool) for n in value):
        lengths, drawn = tuple(value), ""
    else:
        raise BadInput(f"{where}: seqlens must be a list of lengths or a distribution, not {value!r}")
    try:
        Case(op or "gdn", **dims, seqlens=lengths)
    except BadInput as exc:
        raise BadInput(f"{where}: {exc}") from None
    return {"seqlens": lengths, "seqlens_from": drawn}


def dims_only(shape: dict[str, Any]) -> dict[str, int]:
    """A suite's shape without its packed lengths (what ``--shape`` names)."""
    return {k: v for k, v in shape.items() if k not in ("seqlens", "seqlens_from")}


def _dtypes(value: Any, where: str) -> tuple[str, ...]:
    try:
        return tuple(dict.fromkeys(parse_dtype(d) for d in _list(value, "dtypes", where)))
    except BadInput as exc:
        raise BadInput(f"{where}: {exc}") from None


def _modes(value: Any, where: str) -> tuple[str, ...]:
    modes = _list(value, "modes", where)
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise BadInput(f"{where}: unknown mode {bad[0]!r}: use one of {', '.join(MODES)}")
    return tuple(dict.fromkeys(modes))


def _settings(model: type, value: Any, table: str, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadInput(f"{where}: [{table}] must be a table")
    import pydantic

    try:
        model(**value)
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(x) for x in first["loc"])
        raise BadInput(f"{where}: [{table}] {loc}: {first['msg']}") from None
    return dict(value)


def parse_suite(data: dict[str, Any], *, source: str = "<suite>", validate_impls: bool = True) -> Suite:
    """Validate a suite's TOML data and return the :class:`Suite`; every problem is a one-line BadInput.

    With `validate_impls`, each impl must be registered for its op (built-ins, entry points, or a module
    imported with ``--import`` before this call).
    """
    from .ops import get_op
    from .registry import get_impl

    where = f"suite {source}"
    unknown = sorted(set(data) - _TOP_KEYS)
    if unknown:
        raise BadInput(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(_TOP_KEYS))})")
    name = str(data.get("name") or Path(source).stem)
    device = data.get("device")
    if device is not None:
        try:
            device = parse_platform(device)
        except BadInput as exc:
            raise BadInput(f"{where}: {exc}") from None
    regime = data.get("regime", "typical")
    if regime not in REGIMES:
        raise BadInput(f"{where}: unknown regime {regime!r}: use one of {', '.join(REGIMES)}")
    timeout = data.get("timeout_s")
    if timeout is not None and (not isinstance(timeout, (int, float)) or timeout <= 0):
        raise BadInput(f"{where}: timeout_s must be a positive number of seconds")
    isolation = data.get("isolation", "impl")
    if isolation not in ISOLATIONS:
        raise BadInput(f"{where}: isolation must be one of {', '.join(ISOLATIONS)}, not {isolation!r}")
    ops_table = data.get("ops")
    if not isinstance(ops_table, dict) or not ops_table:
        raise BadInput(f"{where}: needs at least one [ops.<op>] table")
    plans = []
    for op, table in ops_table.items():
        here = f"{where}, ops.{op}"
        try:
            get_op(op)
        except BadInput as exc:
            raise BadInput(f"{where}: {exc}") from None
        if not isinstance(table, dict):
            raise BadInput(f"{here}: must be a table")
        bad = sorted(set(table) - _OP_KEYS)
        if bad:
            raise BadInput(f"{here}: unknown key {bad[0]!r} (known: {', '.join(sorted(_OP_KEYS))})")
        impls = tuple(dict.fromkeys(str(i) for i in _list(table.get("impls"), "impls", here)))
        baseline = table.get("baseline", impls[0])
        if baseline not in impls:
            raise BadInput(f"{here}: baseline {baseline!r} is not one of its impls ({', '.join(impls)})")
        if validate_impls:
            for impl in impls:
                try:
                    get_impl(op, impl)
                except BadInput as exc:
                    raise BadInput(f"{here}: {exc} (a user's impl needs --import)") from None
        shapes_value = table.get("shapes", data.get("shapes"))
        if shapes_value is None:
            raise BadInput(f"{here}: no shapes (give 'shapes' at the top or in the op's table)")
        shapes = tuple(_shape(s, here, op) for s in _list(shapes_value, "shapes", here))
        dtypes = _dtypes(table.get("dtypes", data.get("dtypes", ["bf16"])), here)
        modes = _modes(table.get("modes", data.get("modes", ["fwd"])), here)
        plans.append(OpPlan(op, impls, baseline, shapes, dtypes, modes))
    gate_table = data.get("gate")
    gate_workers = 1
    if isinstance(gate_table, dict) and "workers" in gate_table:
        # How the run schedules its gates, not what a gate checks: kept out of the jobs' GateSettings.
        gate_table = dict(gate_table)
        gate_workers = gate_table.pop("workers")
        if isinstance(gate_workers, bool) or not isinstance(gate_workers, int) or gate_workers < 1:
            raise BadInput(f"{where}: [gate] workers: must be a whole number of at least 1, got {gate_workers!r}")
    gate = _settings(GateSettings, gate_table, "gate", where)
    for regime_name in gate.get("regimes") or ():
        for plan in plans:
            known = get_op(plan.op).regimes
            if regime_name not in known:
                raise BadInput(
                    f"{where}, gate.regimes: op {plan.op!r} has no regime {regime_name!r} (its regimes: "
                    f"{', '.join(known)})"
                )
    return Suite(
        name=name,
        description=str(data.get("description", "")),
        ops=tuple(plans),
        device=device,
        timeout_s=float(timeout) if timeout is not None else None,
        isolation=isolation,
        regime=regime,
        initial_state=bool(data.get("initial_state", False)),
        seed=int(data.get("seed", 0)),
        timing=_settings(TimingSettings, data.get("timing"), "timing", where),
        gate=gate,
        source=source,
        gate_workers=gate_workers,
    )


def load_suite(name_or_path: str, *, validate_impls: bool = True) -> Suite:
    """Load a shipped suite by name (``smoke``) or a user's suite from a ``.toml`` path.

    The suite's ``source`` (recorded in each run's document as ``meta.suite_source``) is the path as given, or
    ``suites/NAME.toml (shipped)``: never this machine's absolute install path."""
    path = Path(name_or_path)
    source = name_or_path
    if not (name_or_path.endswith(".toml") or path.is_file()):
        shipped = SUITES_DIR / f"{name_or_path}.toml"
        if not shipped.is_file():
            raise BadInput(
                f"unknown suite {name_or_path!r}: shipped suites are {', '.join(shipped_suites())}, "
                "or give the path of a .toml file"
            )
        path = shipped
        source = f"suites/{name_or_path}.toml (shipped)"
    if not path.is_file():
        raise BadInput(f"suite file {name_or_path!r} does not exist")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise BadInput(f"suite {path}: invalid TOML: {exc}") from None
    return parse_suite(data, source=source, validate_impls=validate_impls)
