"""Helpers for the adapter tests: run deltabench in a child Python where chosen packages cannot be imported."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

# The packages the adapters wrap (import names), hidden in the child so that the tests hold whether or not
# a developer has them installed.
ADAPTER_PACKAGES = ("fla", "flash_qla", "tilelang", "opengdn")

_BLOCKER = textwrap.dedent(
    """
    import importlib.abc, sys

    class _Hide(importlib.abc.MetaPathFinder):
        # Raising from find_spec is what a missing top-level package looks like to importlib.util.find_spec.
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {blocked!r}:
                raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
            return None

    sys.meta_path.insert(0, _Hide())
    """
)


def _run_hidden(code: str, hidden: tuple[str, ...] = ADAPTER_PACKAGES) -> subprocess.CompletedProcess[str]:
    """Run `code` in a child Python in which the `hidden` packages cannot be imported."""
    script = _BLOCKER.format(blocked=set(hidden)) + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="session")
def run_hidden():
    """`run_hidden(code)`: run `code` in a child Python where the adapters' packages cannot be imported."""
    return _run_hidden


@pytest.fixture(scope="session")
def adapter_packages() -> tuple[str, ...]:
    """The import names hidden by `run_hidden`."""
    return ADAPTER_PACKAGES


@pytest.fixture(scope="session")
def listing_without_packages() -> dict:
    """`deltabench list --json --device cuda` as seen where none of the adapters' packages is installed."""
    proc = _run_hidden(
        """
        from deltabench.harness.cli import main
        main(["list", "--json", "--device", "cuda"])
        """
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)
