"""pytest-benchmark JSON -> :class:`ResultDocument`, so a team's existing pytest-benchmark suite lands in the same
history, and ``deltabench gate`` / ``compare`` / ``ingest`` work on its files.

A pytest-benchmark file (``pytest --benchmark-json=out.json`` or ``--benchmark-autosave``) holds ``machine_info``,
``commit_info``, ``datetime``, ``version`` and ``benchmarks[]``, each with ``name``, ``fullname``, ``group``,
``params``, ``extra_info``, ``options`` and ``stats`` (seconds: min, max, mean, stddev, median, q1, q3, iqr, rounds,
iterations, and the raw per-round times in ``data`` when saved with ``--benchmark-save-data``).

Mapping (no change to the result document's schema):

- one benchmark -> one job with ``case.op = "pytest-benchmark"`` and unit dims (B=T=H=K=V=1, dtype fp32, mode fwd:
  required by :class:`CaseSpec`, meaningless here), ``impl = fullname`` (unique per file, so it keys the series),
  ``backend = "pytest-benchmark"``, and ``notes`` a JSON object with name, group, params and extra_info;
- ``stats`` -> :class:`TimingStats` in milliseconds, the raw ``data`` as ``samples_ms`` when present;
- ``machine_info`` -> :class:`Environment`: ``machine_kind`` from the CPU brand (``cpu-<brand>``), so two runners
  with different CPUs never share a series; Python's version as ``python``; ``commit_info`` -> git commit and dirty;
- ``run_id`` and every ``job_id`` are derived from the file's content, so ingesting the same file twice stores it once.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import re
import uuid
from typing import Any

from .document import CaseSpec, Environment, JobResult, ResultDocument, TimingStats
from .errors import BadInput

__all__ = ["EXTERNAL_OP", "is_pytest_benchmark", "machine_kind_of", "to_document"]

EXTERNAL_OP = "pytest-benchmark"
# Namespace for run and job ids derived from content (uuid5): stable across machines and versions.
_ID_NAMESPACE = uuid.UUID("6f1d2c52-7c1e-4d0f-9d2a-5b0a3e8f7c11")


def is_pytest_benchmark(obj: Any) -> bool:
    """True when `obj` (parsed JSON) looks like a pytest-benchmark file: ``benchmarks`` with ``stats``, and
    ``machine_info``."""
    if not isinstance(obj, dict) or not isinstance(obj.get("benchmarks"), list):
        return False
    if "machine_info" not in obj:
        return False
    return all(isinstance(b, dict) and isinstance(b.get("stats"), dict) for b in obj["benchmarks"])


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def machine_kind_of(machine_info: dict[str, Any]) -> str:
    """``cpu-<cpu brand>`` (e.g. ``cpu-intel-r-xeon-r-platinum-8375c-cpu-2-90ghz``), else ``cpu-<arch>``."""
    cpu = machine_info.get("cpu") or {}
    brand = (cpu.get("brand_raw") or cpu.get("brand")) if isinstance(cpu, dict) else None
    brand = brand or machine_info.get("processor") or machine_info.get("machine") or "unknown"
    return f"cpu-{_slug(str(brand))}"[:120]


def _parse_datetime(text: Any) -> _dt.datetime:
    try:
        when = _dt.datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except (TypeError, ValueError):
        return _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)
    # pytest-benchmark before 4.0 wrote naive UTC times.
    return when if when.tzinfo else when.replace(tzinfo=_dt.timezone.utc)


def _timing(stats: dict[str, Any], options: dict[str, Any]) -> TimingStats:
    """pytest-benchmark ``stats`` (seconds) -> TimingStats (milliseconds)."""
    ms = 1e3
    data = [float(x) * ms for x in stats.get("data") or []]
    try:
        median = float(stats["median"]) * ms
        mean = float(stats.get("mean", stats["median"])) * ms
    except (KeyError, TypeError, ValueError) as exc:
        raise BadInput(f"pytest-benchmark stats lack a median: {exc}") from None
    stdev = float(stats.get("stddev") or 0.0) * ms
    rounds = int(stats.get("rounds") or len(data) or 1)
    q1 = float(stats.get("q1", stats["median"])) * ms
    q3 = float(stats.get("q3", stats["median"])) * ms
    # deltabench's sem_rel is the median's standard error over the median: sqrt(pi/2) times the mean's, for
    # roughly normal samples, which is what pytest-benchmark's summary allows us to estimate.
    sem_rel = math.sqrt(math.pi / 2) * stdev / math.sqrt(rounds) / median if median > 0 else 0.0
    warmup = options.get("warmup")
    return TimingStats(
        clock="cpu_monotonic",
        samples_ms=data,
        median_ms=median,
        q1_ms=q1,
        q3_ms=q3,
        mean_ms=mean,
        stdev_ms=stdev,
        sem_rel=sem_rel,
        warmup=int(warmup) if isinstance(warmup, (int, float)) and not isinstance(warmup, bool) else 0,
        stop_reason=f"pytest-benchmark: {rounds} rounds x {int(stats.get('iterations') or 1)} iterations",
    )


def _commit_id(commit: dict[str, Any]) -> str | None:
    """The git commit of ``commit_info``, or None where pytest-benchmark ran outside git (it says "unversioned")."""
    cid = str(commit.get("id") or "")
    return cid if re.fullmatch(r"[0-9a-fA-F]{7,40}", cid) else None


def to_document(obj: dict[str, Any], *, suite: str = "pytest-benchmark") -> ResultDocument:
    """Convert a parsed pytest-benchmark file into a :class:`ResultDocument` (see the module docstring).

    Raises:
        BadInput: `obj` is not a pytest-benchmark file, or a benchmark lacks its name or median.
    """
    if not is_pytest_benchmark(obj):
        raise BadInput("not a pytest-benchmark file: expected machine_info and benchmarks[] with stats")
    canonical = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    run_id = uuid.uuid5(_ID_NAMESPACE, hashlib.sha256(canonical.encode()).hexdigest()).hex
    machine = obj.get("machine_info") or {}
    commit = obj.get("commit_info") or {}
    created = _parse_datetime(obj.get("datetime"))
    cpu = machine.get("cpu") if isinstance(machine.get("cpu"), dict) else {}
    env = Environment(
        host=str(machine.get("node") or "unknown"),
        machine_kind=machine_kind_of(machine),
        device_name=str(cpu.get("brand_raw") or machine.get("processor") or machine.get("machine") or "cpu"),
        device_count=1,
        platform=" ".join(str(machine.get(k, "")) for k in ("system", "release", "machine")).strip(),
        cpu=str(cpu.get("brand_raw") or machine.get("processor") or ""),
        python=str(machine.get("python_version") or ""),
        git_commit=_commit_id(commit),
        git_dirty=bool(commit.get("dirty", False)),
        extra={
            k: str(v)
            for k, v in (
                ("python_implementation", machine.get("python_implementation")),
                ("pytest_benchmark", obj.get("version")),
                ("branch", commit.get("branch")),
                ("project", commit.get("project")),
            )
            if v
        },
    )
    jobs = []
    for bench in obj["benchmarks"]:
        fullname = bench.get("fullname") or bench.get("name")
        if not fullname:
            raise BadInput("a pytest-benchmark entry has neither fullname nor name")
        notes = {
            "name": bench.get("name"),
            "group": bench.get("group"),
            "params": bench.get("params"),
            "extra_info": bench.get("extra_info") or {},
        }
        jobs.append(
            JobResult(
                job_id=uuid.uuid5(_ID_NAMESPACE, f"{run_id}/{fullname}").hex,
                case=CaseSpec(op=EXTERNAL_OP, B=1, T=1, H=1, K=1, V=1, dtype="fp32", mode="fwd"),
                impl=str(fullname),
                backend="pytest-benchmark",
                device="cpu",
                status="ok",
                gate_reference="none: pytest-benchmark measures only",
                timing=_timing(bench["stats"], bench.get("options") or {}),
                notes=json.dumps(notes, sort_keys=True, default=str),
                started_at=created,
                finished_at=created,
            )
        )
    return ResultDocument(
        run_id=run_id,
        created_at=created,
        suite=suite,
        environment=env,
        jobs=jobs,
        meta={"source": "pytest-benchmark", "pytest_benchmark_version": obj.get("version")},
    )
