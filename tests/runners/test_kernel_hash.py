"""The kernel fingerprint covers every source file under kernels/: Python and the CUDA/C++ a kernel compiles."""

from __future__ import annotations

import shutil
from pathlib import Path

from deltabench.runners.environment import kernel_hash, source_root


def test_kernel_hash_changes_with_any_kernel_source(tmp_path: Path) -> None:
    kernels = tmp_path / "kernels" / "myop"
    kernels.mkdir(parents=True)
    (kernels / "__init__.py").write_text("IMPLS = ()\n")
    first = kernel_hash(tmp_path)
    seen = {first}
    for name, text in (("kernel.cu", "__global__ void f() {}"), ("tile.cuh", "#pragma once"), ("bind.cpp", "int x;")):
        (kernels / name).write_text(text)
        seen.add(kernel_hash(tmp_path))
    assert len(seen) == 4  # each new source file is a new fingerprint
    (kernels / "bind.cpp").write_text("int y;")
    assert kernel_hash(tmp_path) not in seen  # and so is each edit
    (kernels / "notes.txt").write_text("not a source")
    (kernels / "bind.cpp").write_text("int x;")
    assert kernel_hash(tmp_path) in seen  # other files do not count
    assert kernel_hash(tmp_path / "elsewhere") is None


def test_kernel_hash_covers_the_backend_folders(tmp_path: Path) -> None:
    """An edit in any backend folder of the shipped kernels (three levels deep for the Pallas kernels) changes the
    fingerprint: the backend folders are inside what it reads."""
    shutil.copytree(source_root() / "kernels", tmp_path / "kernels", ignore=shutil.ignore_patterns("__pycache__"))
    first = kernel_hash(tmp_path)
    nested = [
        "common/triton/mma.py",
        "common/jax/jax_bridge.py",
        "gdn/triton/state.py",
        "gdn/jax/jax_chunk.py",
        "gdn/torch/torch_chunk.py",
        "gdn2/jax/pallas/forward.py",
    ]
    for rel in nested:
        path = tmp_path / "kernels" / rel
        original = path.read_text()
        path.write_text(original + "\n# edited\n")
        assert kernel_hash(tmp_path) != first, rel
        path.write_text(original)
    assert kernel_hash(tmp_path) == first
