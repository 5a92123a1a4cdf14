"""The gate's shared references: computed once per (case, seed), reused by every impl, and never trusted when
the entry on disk is corrupt, foreign or made by other reference code."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from deltabench.correctness import reference_cache as rc
from deltabench.correctness.engine import verify_case
from deltabench.harness import Case, get_impl

CASE = Case("gdn", B=1, T=70, H=2, K=8, V=12, dtype="fp32", mode="fwd+bwd", seed=3)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(rc.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(rc, "_READ_BYTES_PER_S", float("inf"))  # keep every entry, however quick to compute
    return tmp_path


def _counting(values: dict[str, torch.Tensor | None]):
    calls: list[int] = []

    def compute():
        calls.append(1)
        return {n: (t.clone() if isinstance(t, torch.Tensor) else t) for n, t in values.items()}

    return compute, calls


VALUES = {"o": torch.randn(1, 70, 2, 12, dtype=torch.float64), "final_state": torch.randn(1, 2, 8, 12), "grad:g": None}


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        (x is None and y is None) or (isinstance(x, torch.Tensor) and torch.equal(x, y))
        for x, y in zip(a.values(), b.values(), strict=True)
    )


def test_computed_once_then_served_from_disk(cache: Path) -> None:
    compute, calls = _counting(VALUES)
    first = rc.cached_reference(CASE, kind="oracle", grads=True, compute=compute)
    second = rc.cached_reference(CASE, kind="oracle", grads=True, compute=compute)
    assert len(calls) == 1 and _same(first, VALUES) and _same(second, VALUES)
    assert len(list(cache.glob("*.pt"))) == 1
    # The mode matters only through `grads`: bwd shares fwd+bwd's entry, fwd has its own.
    rc.cached_reference(CASE.replace(mode="bwd"), kind="oracle", grads=True, compute=compute)
    assert len(calls) == 1
    for other in (CASE.replace(seed=4), CASE.replace(initial_state=True), CASE.replace(dtype="bf16")):
        rc.cached_reference(other, kind="oracle", grads=True, compute=compute)
    rc.cached_reference(CASE, kind="oracle", grads=False, compute=compute)
    rc.cached_reference(CASE, kind="torch_chunk", grads=True, compute=compute)
    assert len(calls) == 6


@pytest.mark.parametrize("damage", ["flip a byte", "truncate", "empty", "foreign entry"])
def test_a_corrupt_entry_is_recomputed_and_rewritten(cache: Path, damage: str) -> None:
    compute, calls = _counting(VALUES)
    rc.cached_reference(CASE, kind="oracle", grads=True, compute=compute)
    (path,) = cache.glob("*.pt")
    blob = path.read_bytes()
    if damage == "flip a byte":
        path.write_bytes(blob[:-100] + bytes([blob[-100] ^ 0x01]) + blob[-99:])
    elif damage == "truncate":
        path.write_bytes(blob[: len(blob) // 2])
    elif damage == "empty":
        path.write_bytes(b"")
    else:  # a whole, sound entry of another case under this one's name
        rc.cached_reference(CASE.replace(seed=99), kind="oracle", grads=True, compute=_counting(VALUES)[0])
        (other,) = [p for p in cache.glob("*.pt") if p != path]
        other.replace(path)
    again = rc.cached_reference(CASE, kind="oracle", grads=True, compute=compute)
    assert len(calls) == 2 and _same(again, VALUES)
    served = rc.cached_reference(CASE, kind="oracle", grads=True, compute=compute)
    assert len(calls) == 2 and _same(served, VALUES)  # rewritten whole


def test_the_key_holds_the_reference_code_version(cache: Path) -> None:
    oracle = rc.reference_key(CASE, kind="oracle", grads=True)["version"]
    chunk = rc.reference_key(CASE, kind="torch_chunk", grads=True)["version"]
    assert len(oracle) == 16 and oracle != chunk
    root = Path(rc.__file__).resolve().parent.parent
    files = list((root / "references").rglob("*.py"))
    assert rc._hash_files(files, root) == oracle
    assert rc._hash_files(files[1:], root) != oracle  # a changed references/ tree is another version


def test_off_and_quick_entries_write_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(rc.CACHE_ENV, "off")
    compute, calls = _counting(VALUES)
    for _ in range(2):
        rc.cached_reference(CASE, kind="oracle", grads=True, compute=compute)
    assert len(calls) == 2
    monkeypatch.setenv(rc.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(rc, "_READ_BYTES_PER_S", 1.0)  # reading back would take longer than computing
    rc.cached_reference(CASE, kind="oracle", grads=True, compute=compute)
    assert not list(tmp_path.glob("*.pt"))


def test_an_entry_too_large_for_its_share_of_the_cache_is_not_kept(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    compute, _ = _counting(VALUES)
    monkeypatch.setattr(rc, "MAX_ENTRY_BYTES", rc._nbytes(VALUES) - 1)  # worth keeping by time, too large
    rc.cached_reference(CASE, kind="oracle", grads=True, compute=compute)
    assert not list(cache.glob("*.pt"))
    monkeypatch.setattr(rc, "MAX_ENTRY_BYTES", rc._nbytes(VALUES))  # just fits
    rc.cached_reference(CASE, kind="oracle", grads=True, compute=compute)
    assert len(list(cache.glob("*.pt"))) == 1


def test_the_gate_shares_references_across_impls_with_identical_records(cache: Path) -> None:
    case = Case("gdn", B=1, T=70, H=2, K=8, V=12, dtype="fp32", mode="fwd+bwd")
    cold = verify_case(get_impl("gdn", "torch_chunk"), case, seeds=2, extra_seed=False)
    entries = sorted(p.name for p in cache.glob("*.pt"))
    # The oracle runs each stack of the gate's runs in one call (the seeds x regimes x initial states; the length
    # sweep): one entry a stack.
    assert len(entries) == 2
    stamps = {p: p.stat().st_mtime_ns for p in cache.glob("*.pt")}
    other = verify_case(get_impl("gdn", "torch_recurrent"), case, seeds=2, extra_seed=False)
    assert sorted(p.name for p in cache.glob("*.pt")) == entries  # nothing recomputed: no new entry
    assert cold.passed and other.passed
    warm = verify_case(get_impl("gdn", "torch_chunk"), case, seeds=2, extra_seed=False)
    assert [r.model_dump() for r in warm.records] == [r.model_dump() for r in cold.records]
    assert all(p.stat().st_mtime_ns >= stamps[p] for p in stamps)
    # Cached references still catch a planted error: an impl 10% off fails against them.
    wrong = verify_case(
        lambda *a, **kw: _scaled(get_impl("gdn", "torch_chunk"), *a, **kw), case, seeds=2, extra_seed=False
    )
    assert not wrong.passed


def _scaled(fn, *args, **kwargs):
    o, s = fn(*args, **kwargs)
    return o * 1.1, s
