"""Peak memory of one call, net of its inputs, measured in the job's process (fresh, or a shared worker's).

* CUDA: torch's allocator statistics, ``max_memory_allocated`` after ``reset_peak_memory_stats``, minus
  what was allocated before the call (the inputs): the extra memory the call needs, outputs included.
* CPU: torch allocates outside ``tracemalloc``, so the meaningful figure is the growth of the process's
  resident-set high-water mark (``getrusage``) over the first call, labelled host RSS. In a worker that ran
  earlier jobs the mark is first reset (Linux ``/proc/self/clear_refs``) after the C heap returned its free
  memory (``malloc_trim``), so memory an earlier job freed is neither counted nor silently reused.
"""

from __future__ import annotations

import contextlib
import ctypes
import resource
import sys
from collections.abc import Callable
from typing import Any

import torch

from deltabench.harness.document import MemoryStats

__all__ = [
    "CUDA_METHOD",
    "HOST_RSS_METHOD",
    "cuda_peak",
    "reset_rss_high_water",
    "rss_high_water_bytes",
    "tensors_bytes",
]

CUDA_METHOD = "torch.cuda.max_memory_allocated over one call, net of the inputs"
HOST_RSS_METHOD = "host RSS high-water growth over the first call (CPU; includes compilation)"


def tensors_bytes(tensors: Any) -> int:
    """Bytes held by the tensors in a dict, list or tuple (anything else counts 0)."""
    items = tensors.values() if isinstance(tensors, dict) else tensors
    return sum(t.numel() * t.element_size() for t in items if isinstance(t, torch.Tensor))


def rss_high_water_bytes() -> int:
    """This process's peak resident set size so far, in bytes."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # Linux reports KiB, macOS bytes


def reset_rss_high_water() -> bool:
    """Return freed C-heap memory to the OS and reset this process's RSS high-water mark to its current RSS (a
    worker has collected the last job's garbage already: runners/job_main.py).

    False where the platform cannot (not Linux, or ``clear_refs`` not writable): the mark then still holds
    what earlier work in this process reached.
    """
    with contextlib.suppress(OSError, AttributeError):  # glibc only
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # 5: reset the peak RSS (Linux >= 4.0, Documentation/filesystems/proc.rst)
    except OSError:
        return False
    return True


def cuda_peak(fn: Callable[[], Any], inputs_bytes: int) -> MemoryStats:
    """Run `fn` once and return its peak CUDA memory above what was allocated before it."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    del out
    return MemoryStats(peak_bytes=int(peak), inputs_bytes=int(inputs_bytes), method=CUDA_METHOD)
