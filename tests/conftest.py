"""Session-wide test setup.

- ``TRITON_INTERPRET=1`` before anything imports triton, so Triton kernels run on this CPU machine.
- ``nan_filled_empty``: ``torch.empty``/``empty_like``/``Tensor.new_empty`` called from deltabench kernel code
  return NaN-filled tensors, so a kernel that reads memory it never wrote produces NaN and fails its check. It is
  automatic for tests under ``tests/kernels/`` and opt-in elsewhere (request the fixture by name), so it cannot
  disturb other layers' tests.
- ``DELTABENCH_JAX_CACHE_DIR=off``: no persistent JAX compile cache, so tests do not depend on what other processes
  left in it.
- ``DELTABENCH_REFERENCE_CACHE``: the gate's shared references go to a directory of this test session, never the
  user's cache (correctness/reference_cache.py).
- ``one_torch_thread``: torch at one intra-op thread for the test (``pytestmark = pytest.mark.usefixtures(...)`` in
  the modules of many tiny ops, which gain nothing from threads and slow down with them on the shared 2-core CI).
- ``DELTABENCH_REQUIRE_SERVICES=1`` (set by ``.ci/run``): a test skipped because PostgreSQL, Redis or Chromium is
  missing fails instead, so CI can never pass by skipping the real components it is meant to exercise.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest

# Must precede any import of triton (impls import it lazily, on first call).
os.environ.setdefault("TRITON_INTERPRET", "1")
# Tests compile their own JAX programs: a persistent cache shared with other processes on the machine (a CLI run,
# another pytest) makes them depend on its state, and concurrent writers to it were seen to stall a test.
os.environ.setdefault("DELTABENCH_JAX_CACHE_DIR", "off")

_KERNEL_MODULE_PREFIX = "deltabench.kernels."


def _called_from_kernels() -> bool:
    """True when the caller of the patched allocator is deltabench kernel code (two frames up)."""
    frame = sys._getframe(2)
    return str(frame.f_globals.get("__name__", "")).startswith(_KERNEL_MODULE_PREFIX)


def _nan_filling(alloc: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        out = alloc(*args, **kwargs)
        if _called_from_kernels() and out.is_floating_point():
            out.fill_(float("nan"))
        return out

    return wrapper


@pytest.fixture
def nan_filled_empty(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """NaN-fill the uninitialised tensors that deltabench kernel code allocates (FLA does the same)."""
    import torch

    monkeypatch.setattr(torch, "empty", _nan_filling(torch.empty))
    monkeypatch.setattr(torch, "empty_like", _nan_filling(torch.empty_like))
    monkeypatch.setattr(torch.Tensor, "new_empty", _nan_filling(torch.Tensor.new_empty))
    yield


@pytest.fixture(autouse=True)
def _nan_fill_in_kernel_tests(request: pytest.FixtureRequest) -> None:
    """Apply ``nan_filled_empty`` to every test under tests/kernels/."""
    parts = request.node.path.parts
    if "tests" in parts and parts[parts.index("tests") + 1 : parts.index("tests") + 2] == ("kernels",):
        request.getfixturevalue("nan_filled_empty")


@pytest.fixture(autouse=True, scope="session")
def _reference_cache_of_this_session(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Keep the gate's reference cache in a temporary directory (job subprocesses inherit the variable)."""
    os.environ.setdefault("DELTABENCH_REFERENCE_CACHE", str(tmp_path_factory.mktemp("reference-cache")))


# Skip reasons that mean "a real component is missing", as the db, web and fleet tests word them (optional
# kernel packages such as FLA are not services: their adapters' tests still skip without them).
_MISSING_SERVICE = (
    "PostgreSQL at 127.0.0.1:5432 not reachable",
    "Redis at 127.0.0.1:6379 not reachable",
    "apt-get install -y chromium",
)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Under DELTABENCH_REQUIRE_SERVICES=1, turn a skip for a missing service into a failure."""
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("DELTABENCH_REQUIRE_SERVICES") != "1" or not report.skipped:
        return
    reason = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if any(marker in reason for marker in _MISSING_SERVICE):
        report.outcome = "failed"
        report.longrepr = f"required service missing (DELTABENCH_REQUIRE_SERVICES=1): {reason}"


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """torch at one intra-op thread for the test, the caller's count restored after."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
