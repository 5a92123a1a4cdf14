"""Helpers for the adapter tests: run deltabench in a child Python where chosen packages cannot be imported."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

# The packages the adapters wrap (import names), hidden in the child so that the tests hold whether or not
# a developer has them installed.
ADAPTER_PACKAGES = ("fla", "flash_qla", "tilelang", "flashinfer", "opengdn", "atomic_ops", "sparse_delta_memory")

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
def adapter_packages() -> tuple[str, ...]:
    """The import names hidden from the child Python."""
    return ADAPTER_PACKAGES


@pytest.fixture(scope="session")
def without_packages() -> dict:
    """One child Python without the adapters' packages: `deltabench list --json --device cuda` as it sees it
    ("listing"), which of those packages got imported after importing every adapter and the registry ("loaded"),
    the FLA switches in its environment ("env"), `fla.run_notes()` ("notes"), and the module named by the error
    that calling ``opengdn_chunkwise`` raised ("missing")."""
    proc = _run_hidden(
        """
        import contextlib, io, json, os, sys
        import torch
        import deltabench.kernels.external.fla as fla_adapter
        import deltabench.kernels.external.flash_qla
        import deltabench.kernels.external.opengdn
        from deltabench.cli.app import main
        from deltabench.harness.registry import get_impl

        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            main(["list", "--json", "--device", "cuda"])
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in {"fla", "flash_qla", "tilelang", "opengdn"})
        x = torch.zeros(1, 4, 1, 8)
        try:
            get_impl("gdn", "opengdn_chunkwise")(x, x, x, x[..., 0], x[..., 0])
            missing = None
        except ModuleNotFoundError as exc:
            missing = exc.name
        print(json.dumps({
            "listing": json.loads(out.getvalue()),
            "loaded": loaded,
            "env": [os.environ.get("FLA_FLASH_QLA"), os.environ.get("FLA_TILELANG")],
            "notes": fla_adapter.run_notes(),
            "missing": missing,
        }))
        """
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="session")
def listing_without_packages(without_packages) -> dict:
    """`deltabench list --json --device cuda` as seen where none of the adapters' packages is installed."""
    return without_packages["listing"]
