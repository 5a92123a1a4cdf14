"""Series: which timings may be compared with each other.

A series is one (op, impl, case shape, mode, dtype) measured on one machine class with the same major software
versions (``major.minor`` of torch, triton, jax, CUDA and Python). Timings in one series form a history over commits;
timings in two different series are never compared: a new GPU or a torch upgrade starts a new history, as conbench's
history fingerprint does.

Two keys come out of a job:

- :func:`job_key` matches a job of one run with the same job of another run (op, impl, shape, dtype, mode);
- :func:`series_key` adds the machine class and the software versions; its ``.key`` is a stable string for storage.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Mapping
from typing import Any

from .document import Environment, JobResult

__all__ = [
    "SOFTWARE_FIELDS",
    "JobKey",
    "SeriesKey",
    "context_mismatch",
    "context_of",
    "job_key",
    "major_minor",
    "parse_software",
    "series_key",
    "series_software",
    "software_context",
]

# Environment fields whose major.minor version splits a series. Patch releases stay in one series: they rarely move
# kernel timings, and splitting on them would leave every history a few points long.
SOFTWARE_FIELDS: tuple[str, ...] = ("torch", "triton", "jax", "cuda", "python")

JobKey = tuple[str, str, str, str, str]


def major_minor(version: str | None) -> str | None:
    """``"2.13.0+cu130"`` -> ``"2.13"``; ``"3.11.9 (main, ...)"`` -> ``"3.11"``; None or unparsable -> as given."""
    if version is None:
        return None
    m = re.match(r"\s*v?(\d+)(?:\.(\d+))?", str(version))
    if not m:
        return str(version).strip() or None
    return f"{m.group(1)}.{m.group(2) or 0}"


def context_of(env: Environment) -> dict[str, str | None]:
    """The part of an environment that must match for two timings to be comparable."""
    ctx: dict[str, str | None] = {"machine_kind": env.machine_kind}
    for name in SOFTWARE_FIELDS:
        ctx[name] = major_minor(getattr(env, name))
    return ctx


def software_context(versions: Mapping[str, str | None]) -> str:
    """The software part of a series, as stored with each result: ``"python=3.11,torch=2.13,triton=3.6"``.

    `versions` maps the names in :data:`SOFTWARE_FIELDS` to full version strings (missing or None: not used).
    Sorted by name, major.minor only; the same string :attr:`SeriesKey.key` carries in brackets.
    """
    pairs = ((name, major_minor(versions.get(name))) for name in SOFTWARE_FIELDS)
    # An unparsable version is kept as given; its separators are swapped so the string still parses back.
    return ",".join(
        f"{k}={v.replace(',', ';').replace('=', ':')}" for k, v in sorted((k, v) for k, v in pairs if v is not None)
    )


def parse_software(text: str) -> tuple[tuple[str, str], ...]:
    """Inverse of :func:`software_context`: ``"python=3.11,torch=2.13"`` -> ``(("python", "3.11"), ("torch", "2.13"))``.

    Raises:
        ValueError: an item is not ``name=version``.
    """
    items = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, version = item.partition("=")
        if not sep or not name.strip() or not version.strip():
            raise ValueError(f"software context items are name=version, got {item!r}")
        items.append((name.strip(), version.strip()))
    return tuple(sorted(items))


def context_mismatch(a: Environment, b: Environment) -> str | None:
    """Why timings on `a` and on `b` are not comparable (one line), or None when they are."""
    ca, cb = context_of(a), context_of(b)
    diffs = [f"{k} {ca[k]} vs {cb[k]}" for k in ca if ca[k] != cb[k]]
    return "; ".join(diffs) if diffs else None


def job_key(job: JobResult) -> JobKey:
    """(op, impl, shape, dtype, mode): what matches a job in one run with the same job in another."""
    c = job.case
    return (c.op, job.impl, c.shape_id, c.dtype, c.mode)


@dataclasses.dataclass(frozen=True)
class SeriesKey:
    """One comparable series: a job's identity plus the machine class and major software versions."""

    op: str
    impl: str
    shape: str
    dtype: str
    mode: str
    machine_kind: str
    software: tuple[tuple[str, str], ...]

    @property
    def key(self) -> str:
        """Stable readable string, e.g. ``gdn/triton_chunk/B8-T4096-H6-K128-V128/bf16/fwd@h200[torch=2.13,...]``."""
        return f"{self.op}/{self.impl}/{self.shape}/{self.dtype}/{self.mode}@{self.machine_kind}[{self.software_text}]"

    @property
    def software_text(self) -> str:
        """The software part as one string (``"python=3.11,torch=2.13"``), as the store keeps it per result."""
        return ",".join(f"{k}={v}" for k, v in self.software)

    @property
    def fingerprint(self) -> str:
        """A short hash of :attr:`key` (fits an index column)."""
        return hashlib.sha256(self.key.encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form, software as a mapping."""
        d = dataclasses.asdict(self)
        d["software"] = dict(self.software)
        d["key"] = self.key
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SeriesKey:
        """Inverse of :meth:`to_dict` (the ``key`` entry is ignored: it is derived)."""
        return cls(
            op=d["op"],
            impl=d["impl"],
            shape=d["shape"],
            dtype=d["dtype"],
            mode=d["mode"],
            machine_kind=d["machine_kind"],
            software=tuple(sorted((str(k), str(v)) for k, v in dict(d["software"]).items())),
        )

    def __str__(self) -> str:
        return self.key


def series_key(job: JobResult, env: Environment) -> SeriesKey:
    """The series `job` (measured in `env`) belongs to. Software a run did not use (None) is left out."""
    op, impl, shape, dtype, mode = job_key(job)
    return SeriesKey(op, impl, shape, dtype, mode, env.machine_kind, parse_software(series_software(env)))


def series_software(env: Environment) -> str:
    """:func:`software_context` of a run's environment: the software part of every series it measured."""
    return software_context({name: getattr(env, name) for name in SOFTWARE_FIELDS})
