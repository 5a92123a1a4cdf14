"""The environment names where compiled kernels and the gate's references persist, and whether they were cold."""

from __future__ import annotations

from pathlib import Path

import pytest

from deltabench.runners.environment import collect_environment, compile_caches


def test_caches_follow_each_tools_variables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    triton, tilelang, jax, refs = (tmp_path / n for n in ("triton", "tilelang", "jax", "refs"))
    triton.mkdir()
    (triton / "abc123").mkdir()
    jax.mkdir()
    monkeypatch.setenv("TRITON_CACHE_DIR", str(triton))
    monkeypatch.setenv("TILELANG_CACHE_DIR", str(tilelang))
    monkeypatch.setenv("DELTABENCH_JAX_CACHE_DIR", str(jax))
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    monkeypatch.setenv("DELTABENCH_REFERENCE_CACHE", str(refs))
    assert compile_caches() == {
        "cache.triton": f"{triton} (1 entries), autotuning cached",
        "cache.tilelang": f"{tilelang} (absent)",
        "cache.jax": f"{jax} (empty)",
        "cache.references": f"{refs} (absent)",
    }
    monkeypatch.setenv("DELTABENCH_JAX_CACHE_DIR", "off")
    monkeypatch.setenv("DELTABENCH_REFERENCE_CACHE", "off")
    monkeypatch.delenv("TRITON_CACHE_DIR")
    monkeypatch.setenv("TRITON_HOME", str(tmp_path))
    monkeypatch.setenv("TRITON_CACHE_AUTOTUNING", "0")  # the user's choice wins over the jobs' default
    caches = compile_caches()
    assert caches["cache.jax"] == "off" and caches["cache.references"] == "off"
    assert caches["cache.triton"] == f"{tmp_path / '.triton' / 'cache'} (absent), autotuning not cached"
    assert collect_environment("cpu").extra["cache.triton"] == caches["cache.triton"]
