"""The repository keeps the shape its layout promises: a small core in harness/, benchmarks/ as code and
published results (no run logs), a decisions log and a front-page README short enough to read."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _tracked(folder: str) -> list[str]:
    out = subprocess.run(["git", "ls-files", folder], cwd=ROOT, capture_output=True, text=True, check=True)
    return out.stdout.split()


@pytest.fixture(autouse=True)
def _in_a_checkout() -> None:
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")


def test_harness_holds_only_the_core() -> None:
    files = _tracked("src/deltabench/harness")
    assert len(files) <= 16, f"harness/ tracks {len(files)} files (at most 16): {files}"


def test_benchmarks_is_code_not_logs() -> None:
    files = _tracked("benchmarks")
    assert len(files) <= 150, f"benchmarks/ tracks {len(files)} files (at most 150)"
    assert not [f for f in files if "/session-" in f or Path(f).name.startswith("session-")]


@pytest.mark.parametrize(("path", "most"), [("benchmarks/NOTES.md", 500), ("README.md", 250)])
def test_documents_stay_short(path: str, most: int) -> None:
    lines = len((ROOT / path).read_text().splitlines())
    assert lines <= most, f"{path} has {lines} lines (at most {most}): condense it, the story belongs in git history"
