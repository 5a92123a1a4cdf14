"""The kernel fingerprint covers every source file under kernels/: Python and the CUDA/C++ a kernel compiles."""

from __future__ import annotations

from pathlib import Path

from deltabench.runners.environment import kernel_hash


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
