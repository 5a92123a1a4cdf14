"""Will a case fit in host memory? A lower-bound estimate, made before anything is allocated.

A shape such as ``B=1000000`` would otherwise fail deep inside the first allocation ("can't allocate ... bytes")
and read as the kernel's fault. ``verify`` and ``run`` call :func:`check_fits` first and stop with exit code 2
when the estimate exceeds the host memory available. Only host memory is judged: every device draws its inputs
on the CPU in float32 first (references/_inputs.py), and the float64 oracle always runs there.

The estimate counts, from :func:`deltabench.harness.ops.work`'s byte counts (inputs read once, outputs written
once, the state in float32):

* the inputs drawn in float32;
* on the CPU, the impl's working set: its inputs in the case's dtype and one call's outputs (and gradients);
* the reference: the float64 oracle's inputs and outputs, and with gradients the autograd graph of its token loop
  (a few ``[B, H, K, V]`` float64 tensors per token); or, when ``reference="auto"`` leaves the oracle at this
  size, the chunked torch reference in fp32 (on the case's device) plus the oracle at the shorter case.

Temporaries of the impl itself are not counted, so a case refused here cannot run, and a case accepted may
still run out of memory (a job then ends ``oom``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterable
from pathlib import Path

from deltabench.harness.cases import Case
from deltabench.harness.errors import BadInput
from deltabench.harness.ops import get_op, work

__all__ = ["MemoryNeed", "check_fits", "check_jobs_fit", "estimate_need", "format_bytes", "host_memory_available"]

# float64 bytes per (token x state element) the oracle's autograd keeps: three [B,H,K,V] tensors per token is
# the floor (ORACLE_MAX_ELEMENTS_GRAD's 4e7 element-steps use about 1.2 GB).
_ORACLE_GRAD_BYTES_PER_STEP = 3 * 8


@dataclasses.dataclass(frozen=True)
class MemoryNeed:
    """Host bytes a case needs at least, by part."""

    inputs: float  # the inputs as drawn, in float32
    impl: float  # the impl's inputs, outputs and gradients when it runs on the CPU (0 on a GPU)
    reference: float  # the oracle (or the chunked reference when on the CPU, plus the oracle at a shorter case)
    reference_name: str

    @property
    def total(self) -> float:
        """The sum of the parts."""
        return self.inputs + self.impl + self.reference


def _call_bytes(case: Case, dtype: str, mode: str) -> float:
    return work(case.op, case.dims, dtype, mode)["bytes"]


def _steps(case: Case) -> float:
    """The oracle's element-steps at `case` (the contract's cost: B*T*H*K*V for the delta family)."""
    return get_op(case.op).cost(case.dims)


def _oracle_bytes(case: Case, grads: bool) -> float:
    steps = _steps(case)
    # float64 is twice float32's bytes
    return 2 * _call_bytes(case, "fp32", "fwd") + (_ORACLE_GRAD_BYTES_PER_STEP * steps if grads else 0.0)


def estimate_need(case: Case, *, reference: str = "auto", grads: bool | None = None) -> MemoryNeed:
    """A lower bound of the host memory verifying (and timing) `case` needs; see the module docstring.

    `grads` defaults to the mode's (``fwd+bwd`` and ``bwd``) (an impl without a backward passes False)."""
    from .plan import ORACLE_MAX_ELEMENTS, ORACLE_MAX_ELEMENTS_GRAD, SHORT_T

    if grads is None:
        from deltabench.harness.cases import has_backward

        grads = has_backward(case.mode)
    mode = "fwd+bwd" if grads else "fwd"
    drawn = _call_bytes(case, "fp32", "fwd")
    impl = _call_bytes(case, case.dtype, "fwd") + _call_bytes(case, case.dtype, mode) if case.device == "cpu" else 0.0
    steps = _steps(case)
    limit = ORACLE_MAX_ELEMENTS_GRAD if grads else ORACLE_MAX_ELEMENTS
    if reference == "oracle" or (reference == "auto" and steps <= limit):
        return MemoryNeed(drawn, impl, _oracle_bytes(case, grads), "float64 oracle")
    # The oracle at the short case: at most `limit` element-steps (the contract's rule, as plan.short_case cuts it).
    short = case.replace(**get_op(case.op).shrink(case.dims, limit, SHORT_T))
    ref = _oracle_bytes(short, grads)
    if case.device == "cpu":
        ref += _call_bytes(case, "fp32", "fwd") + _call_bytes(case, "fp32", mode)
    return MemoryNeed(drawn, impl, ref, "torch_chunk in fp32 and the float64 oracle at a shorter T")


def _read_int(path: str) -> int | None:
    try:
        text = Path(path).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def host_memory_available() -> int | None:
    """Bytes of host memory this process can still use: MemAvailable, capped by a cgroup v2 limit; None when
    unknown (not Linux)."""
    avail = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
                break
    except (OSError, ValueError, IndexError):
        avail = None
    if avail is None:
        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            return None
    limit, used = _read_int("/sys/fs/cgroup/memory.max"), _read_int("/sys/fs/cgroup/memory.current")
    if limit is not None and used is not None:
        avail = min(avail, max(limit - used, 0))
    return avail


def format_bytes(n: float) -> str:
    """``n`` bytes in binary units, e.g. ``1.5 GiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def check_fits(case: Case, *, reference: str = "auto", grads: bool | None = None, what: str = "") -> MemoryNeed:
    """Raise BadInput when `case` cannot fit in the host memory available (estimate versus available, in one
    line); return the estimate otherwise. `what` names the subject in the message (default: the case)."""
    need = estimate_need(case, reference=reference, grads=grads)
    avail = host_memory_available()
    if avail is not None and need.total > avail:
        subject = what or f"{case.op} {case.shape_id} {case.dtype} {case.mode} on {case.device}"
        raise BadInput(
            f"{subject} needs at least {format_bytes(need.total)} of host memory (inputs "
            f"{format_bytes(need.inputs)}, impl {format_bytes(need.impl)}, {need.reference_name} "
            f"{format_bytes(need.reference)}); {format_bytes(avail)} is available: use a smaller shape"
        )
    return need


def check_jobs_fit(jobs: Iterable[tuple[Case, str | None, str]]) -> None:
    """Raise BadInput naming the first job that cannot fit in host memory, before any starts (``deltabench run``,
    a job submitted to the service). Each job is (case, impl, gate reference): its gradients count where its mode
    has a backward and the impl has one; an impl that is None or not registered here counts as having one (the
    largest need of any impl)."""
    from deltabench.harness.cases import has_backward
    from deltabench.harness.registry import get_impl

    for case, impl, reference in jobs:
        grads = has_backward(case.mode)
        if grads and impl is not None:
            # An impl not registered in this process (a worker's --import) is judged as having a backward.
            with contextlib.suppress(BadInput):
                grads = get_impl(case.op, impl).supports_backward
        what = f"{case.op}/{impl} at {case.shape_id} {case.dtype} {case.mode} on {case.device}" if impl else ""
        check_fits(case, reference=reference, grads=grads, what=what)
