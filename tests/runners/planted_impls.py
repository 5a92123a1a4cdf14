"""Deliberately broken gdn impls, registered for the runner's fault tests (imported with --import).

Each has the op's signature; all but the wrong one never return. They wrap the chunked PyTorch reference
so that the one impl that does return is fast and right except for its planted error.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
from pathlib import Path

import torch

from deltabench.harness.registry import register_impl
from deltabench.kernels.gdn.torch.torch_chunk import gdn_torch_chunk

_ANY = dict(backend="torch", devices=("cpu", "cuda"), dtypes=("fp32", "bf16", "fp16"))


@register_impl("gdn", "planted_wrong", **_ANY)
def planted_wrong(q, k, v, g, beta, scale=None, initial_state=None):
    """Right state, output 10% too large: the gate must reject it."""
    o, state = gdn_torch_chunk(q, k, v, g, beta, scale=scale, initial_state=initial_state)
    return o * 1.1, state


@register_impl("gdn", "planted_raise", **_ANY)
def planted_raise(q, k, v, g, beta, scale=None, initial_state=None):
    """Raises, as a kernel with a launch error would."""
    raise RuntimeError("planted failure: kernel launch refused")


@register_impl("gdn", "planted_hang", **_ANY)
def planted_hang(q, k, v, g, beta, scale=None, initial_state=None):
    """Never returns, as a deadlocked kernel would."""
    while True:
        time.sleep(1)


@register_impl("gdn", "planted_segfault", **_ANY)
def planted_segfault(q, k, v, g, beta, scale=None, initial_state=None):
    """Dereferences a null pointer: the process dies by SIGSEGV."""
    ctypes.string_at(0)


@register_impl("gdn", "planted_exit", **_ANY)
def planted_exit(q, k, v, g, beta, scale=None, initial_state=None):
    """Leaves the process at once with exit code 3, writing no result."""
    os._exit(3)


@register_impl("gdn", "planted_cuda_only", backend="torch", devices=("cuda",), dtypes=("fp32",))
def planted_cuda_only(q, k, v, g, beta, scale=None, initial_state=None):
    """Declared for CUDA only: on a CPU run it is `unsupported`, and no process is started for it."""
    return gdn_torch_chunk(q, k, v, g, beta, scale=scale, initial_state=initial_state)


# planted_fragile's faults, by the job's T (never a length the gate's streaming halves of the other Ts reach).
FRAGILE_SEGFAULT_T, FRAGILE_HANG_T, FRAGILE_OOM_T = 40, 41, 42


@register_impl("gdn", "planted_fragile", **_ANY)
def planted_fragile(q, k, v, g, beta, scale=None, initial_state=None):
    """Right at most lengths; segfaults, hangs or runs out of memory at one T each, as a kernel with a bad
    launch configuration for one shape would, in the middle of a worker process that ran other jobs."""
    T = q.shape[1]
    if T == FRAGILE_SEGFAULT_T:
        os.kill(os.getpid(), signal.SIGSEGV)
    if T == FRAGILE_HANG_T:
        while True:
            time.sleep(1)
    if T == FRAGILE_OOM_T:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB (planted)")
    return gdn_torch_chunk(q, k, v, g, beta, scale=scale, initial_state=initial_state)


@register_impl("gdn", "planted_first_process_only", **_ANY)
def planted_first_process_only(q, k, v, g, beta, scale=None, initial_state=None):
    """Right in the first process that calls it; segfaults in any later one (a kernel that breaks in a fresh
    process, as a repeated run's later repetitions are). The first process's id is kept in the file that
    ``PLANTED_FIRST_PID_FILE`` names; without it the impl is always right."""
    marker = os.environ.get("PLANTED_FIRST_PID_FILE")
    if marker:
        if not os.path.exists(marker):
            with open(marker, "w") as f:
                f.write(str(os.getpid()))
        elif Path(marker).read_text() != str(os.getpid()):
            os.kill(os.getpid(), signal.SIGSEGV)
    return gdn_torch_chunk(q, k, v, g, beta, scale=scale, initial_state=initial_state)


_calls_here = 0  # calls of planted_gate_crash in this process


@register_impl("gdn", "planted_gate_crash", **_ANY)
def planted_gate_crash(q, k, v, g, beta, scale=None, initial_state=None):
    """Right on a process's first call (a job's first call); segfaults on its second, which is the gate's first:
    an impl that crashes in its gate and nowhere else."""
    global _calls_here
    _calls_here += 1
    if _calls_here == 2:
        os.kill(os.getpid(), signal.SIGSEGV)
    return gdn_torch_chunk(q, k, v, g, beta, scale=scale, initial_state=initial_state)


@register_impl("gdn", "planted_oom_when_shared", **_ANY)
def planted_oom_when_shared(q, k, v, g, beta, scale=None, initial_state=None):
    """Right when its process has the whole device; runs out of memory when told it shares the device with other
    gates (``DELTABENCH_DEVICE_SHARE`` below 1): a kernel that fits alone and not beside others."""
    if float(os.environ.get("DELTABENCH_DEVICE_SHARE", "1")) < 1:
        raise torch.OutOfMemoryError(  # torch's own wording (2.11 on an H200), planted: the device is shared
            "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 139.80 GiB of which "
            "323.06 MiB is free. Including non-PyTorch memory, this process has 27.46 GiB memory in use. Of the "
            "allocated memory 26.10 GiB is allocated by PyTorch, and 830.00 MiB is reserved by PyTorch but unallocated."
        )
    return gdn_torch_chunk(q, k, v, g, beta, scale=scale, initial_state=initial_state)
