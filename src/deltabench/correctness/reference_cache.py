"""The gate's references, computed once per (case, seed) and shared by every impl and job of a run.

The correctness gate compares each impl with a reference run on the very same inputs: the float64 oracle
(at the full shape, or at the reduced case the oracle can afford) or the chunked torch reference in fp32
at the full shape. Those runs depend only on the case (op, dims, dtype, regime, seed, initial state,
device), on whether gradients are compared, and on the reference code, never on the impl; yet every job
of every impl used to recompute them, and the oracle, a float64 token loop with autograd, is often the
costliest part of a job. Here they are kept on disk:

* under ``$DELTABENCH_REFERENCE_CACHE`` (a directory; ``off`` disables the cache), else
  ``$XDG_CACHE_HOME/deltabench/references`` (``~/.cache/deltabench/references``);
* keyed by the case (its device included), what its inputs were drawn with beyond it (scale, q/k norms, the
  stacked runs; for a CUDA case the GPU model they were drawn on, references/_inputs.py ``draw_origin``), the
  reference kind, the gradients flag, torch's version and a reference version: a hash
  of the ``references/`` sources (and, for the chunked reference, of its module and the ``kernels/common``
  helpers it builds on), so an edited oracle never serves an old answer;
* written atomically (a temporary file renamed into place), with a SHA-256 of the content checked on every
  read together with the key stored inside: a corrupt, truncated or foreign entry is recomputed and
  rewritten, never trusted;
* only when worth it: an entry is written when computing it took longer than reading it back would
  (:data:`_READ_BYTES_PER_S`: the file read, its SHA-256 and ``torch.load`` together), so a reference that a
  GPU computes in a second is not traded for a gigabyte of disk, and never when it is over
  :data:`MAX_ENTRY_BYTES`, which would evict the entries the run is about to reuse; the whole cache is kept
  under :data:`MAX_CACHE_BYTES`, the least recently used entries going first.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import inspect
import io
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from deltabench.harness.cases import Case

__all__ = [
    "CACHE_ENV",
    "MAX_CACHE_BYTES",
    "MAX_ENTRY_BYTES",
    "cache_dir",
    "cached_reference",
    "reference_key",
    "reference_version",
]

CACHE_ENV = "DELTABENCH_REFERENCE_CACHE"
MAX_CACHE_BYTES = 4 * 2**30  # least recently used entries are dropped beyond this
MAX_ENTRY_BYTES = MAX_CACHE_BYTES // 16  # larger entries are not kept: a few would evict the run's others
# Reading an entry back (the file, its SHA-256, torch.load) runs at ~0.2 GB/s on a 2-core host (604 MB in 2.9 s;
# writing it, 6.6 s): a reference a GPU computes at 1 GB/s is cheaper to compute again.
_READ_BYTES_PER_S = 2e8
_MAGIC = b"deltabench-reference-1\n"

Tensors = dict[str, torch.Tensor | None]


def cache_dir() -> Path | None:
    """Where references are kept, or None when the cache is off (``DELTABENCH_REFERENCE_CACHE=off``)."""
    wanted = os.environ.get(CACHE_ENV, "")
    if wanted.lower() == "off":
        return None
    if wanted:
        return Path(wanted)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "deltabench" / "references"


def _hash_files(paths: list[Path], root: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(paths):
        h.update(str(path.relative_to(root)).encode())
        h.update(b"\0")
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def _source_root() -> Path:
    return Path(__file__).resolve().parent.parent


@functools.cache
def _chunk_sources(op: str) -> tuple[Path, ...]:
    """The chunked torch reference's module and the kernels/common helpers it builds on."""
    from deltabench.harness.ops import get_op
    from deltabench.harness.registry import get_impl

    fn = get_impl(op, get_op(op).reference_impl).fn
    target = getattr(fn, "__deltabench_target__", None)
    origin = importlib.util.find_spec(target.partition(":")[0]).origin if target else inspect.getsourcefile(fn)
    files = [Path(origin).resolve()] if origin else []
    common = _source_root() / "kernels" / "common"
    return tuple(files + sorted(common.rglob("*.py")))


@functools.cache
def reference_version(kind: str, op: str) -> str:
    """A hash of the code a reference of `kind` (``oracle`` or ``torch_chunk``) for `op` runs."""
    root = _source_root()
    files = list((root / "references").rglob("*.py"))
    if kind != "oracle":
        files += [f for f in _chunk_sources(op) if f.is_relative_to(root)]
    return _hash_files(files, root)


def reference_key(case: Case, *, kind: str, grads: bool, draws: str = "") -> dict[str, Any]:
    """What a reference run depends on: the case (its mode only through `grads`), what its inputs were drawn
    with beyond the case (`draws`), the kind and its version."""
    key = case.to_dict()
    key.pop("mode", None)
    # torch too: the same code may round differently under another torch (its CPU and cuBLAS kernels).
    key.update(kind=kind, grads=grads, version=reference_version(kind, case.op), torch=torch.__version__)
    if draws:
        key["draws"] = draws
    return key


def _entry_path(root: Path, key: dict[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]
    return root / f"{key['op']}-{digest}.pt"


def _read(path: Path, key: dict[str, Any]) -> Tensors | None:
    """The entry at `path` if it is whole and is the one for `key`; None otherwise."""
    try:
        blob = path.read_bytes()
    except OSError:
        return None
    head = len(_MAGIC) + 32
    if len(blob) < head or not blob.startswith(_MAGIC):
        return None
    payload = blob[head:]
    if hashlib.sha256(payload).digest() != blob[len(_MAGIC) : head]:
        return None
    try:
        entry = torch.load(io.BytesIO(payload), weights_only=True)
    except Exception:
        return None
    if not isinstance(entry, dict) or entry.get("key") != json.dumps(key, sort_keys=True):
        return None
    tensors = entry.get("tensors")
    if not isinstance(tensors, dict):
        return None
    with contextlib.suppress(OSError):
        os.utime(path)  # recently used: evicted last
    return tensors


def _write(path: Path, key: dict[str, Any], tensors: Tensors) -> None:
    buf = io.BytesIO()
    torch.save({"key": json.dumps(key, sort_keys=True), "tensors": tensors}, buf)
    payload = buf.getvalue()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(_MAGIC + hashlib.sha256(payload).digest() + payload)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    _evict(path.parent)


def _evict(root: Path) -> None:
    """Drop the least recently used entries while the cache holds more than MAX_CACHE_BYTES."""
    entries = []
    for p in root.glob("*.pt"):
        with contextlib.suppress(OSError):
            st = p.stat()
            entries.append((st.st_mtime, st.st_size, p))
    total = sum(size for _, size, _ in entries)
    for _, size, p in sorted(entries, key=lambda e: e[0]):
        if total <= MAX_CACHE_BYTES:
            break
        p.unlink(missing_ok=True)
        total -= size


def _nbytes(tensors: Tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values() if isinstance(t, torch.Tensor))


def cached_reference(case: Case, *, kind: str, grads: bool, compute: Callable[[], Tensors], draws: str = "") -> Tensors:
    """The reference tensors of `case` (``o``, ``final_state``, ``grad:<input>``), from the cache when a sound
    entry exists, else from `compute()` (then stored when worth it). Returned tensors are detached."""
    root = cache_dir()
    if root is None:
        return _detached(compute())
    key = reference_key(case, kind=kind, grads=grads, draws=draws)
    path = _entry_path(root, key)
    hit = _read(path, key)
    if hit is not None:
        return hit
    t0 = time.perf_counter()
    tensors = _detached(compute())
    elapsed = time.perf_counter() - t0
    size = _nbytes(tensors)
    if size <= MAX_ENTRY_BYTES and elapsed >= size / _READ_BYTES_PER_S:
        with contextlib.suppress(OSError):  # a full or read-only disk costs the next job a recomputation only
            _write(path, key, tensors)
    return tensors


def _detached(tensors: Tensors) -> Tensors:
    return {n: t.detach() if isinstance(t, torch.Tensor) else t for n, t in tensors.items()}
