"""The machine's ceilings, measured once and cached: the matmul rate and the copy bandwidth.

Achieved TFLOP/s and GB/s are placed against them: ``floor_ms = max(flops / peak, bytes / bandwidth)``
and ``pct_of_floor = 100 * floor_ms / median_ms``. On CUDA the ceilings are a bf16 8192^3 matmul and a
device-to-device copy of 1 GiB; on the CPU an fp32 1024^3 matmul and a 64 MiB memcpy (a quick estimate).
Copy bandwidth counts read plus write. The cache is a per-user JSON file keyed by device name:
``$XDG_CACHE_HOME/deltabench/ceilings.json`` (default ``~/.cache/deltabench/ceilings.json``).
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

from deltabench.harness.document import WorkFigures
from deltabench.harness.ops import get_op, work

__all__ = ["cache_path", "ceilings_for", "measure_ceilings", "work_figures"]


def cache_path() -> Path:
    """Where measured ceilings are cached."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "deltabench" / "ceilings.json"


def _median_seconds(fn, reps: int, sync) -> float:
    fn()
    sync()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _matmul_seconds(n: int, dtype, device: str, reps: int, sync) -> float:
    import torch

    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    return _median_seconds(lambda: torch.mm(a, b), reps, sync)


def _copy_seconds(nbytes: int, device: str, reps: int, sync) -> float:
    import torch

    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    return _median_seconds(lambda: dst.copy_(src), reps, sync)


def measure_ceilings(device: str = "cpu") -> dict[str, float]:
    """Measure ``{"matmul_tflops", "copy_gbps"}`` on `device` now (seconds on a GPU, under one on a CPU).

    A TPU gets none (``{}``: its results carry no roofline floor): the probes are torch's, and torch has no TPU.
    """
    import torch

    if device == "tpu":
        return {}
    if device == "cuda":
        n, dtype, reps, copy_bytes = 8192, torch.bfloat16, 20, 2**30
        sync = torch.cuda.synchronize
    else:
        n, dtype, reps, copy_bytes = 1024, torch.float32, 5, 64 * 2**20
        sync = lambda: None
    mm_s = _matmul_seconds(n, dtype, device, reps, sync)
    cp_s = _copy_seconds(copy_bytes, device, reps, sync)
    if device == "cuda":
        torch.cuda.empty_cache()  # the parent holds no memory the jobs could need
    return {
        "matmul_tflops": 2 * n**3 / mm_s / 1e12,
        "copy_gbps": 2 * copy_bytes / cp_s / 1e9,  # read + write
        "matmul_dtype_bits": float(torch.finfo(dtype).bits),
    }


def ceilings_for(device: str, device_name: str, *, refresh: bool = False) -> dict[str, float]:
    """The cached ceilings of `device_name`, measuring and storing them on first use (or on `refresh`)."""
    path = cache_path()
    try:
        cache = json.loads(path.read_text())
    except (OSError, ValueError):
        cache = {}
    key = f"{device}:{device_name}"
    if refresh or key not in cache:
        cache[key] = measure_ceilings(device)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(cache, indent=1, sort_keys=True))
            os.replace(tmp, path)
        except OSError:
            pass  # a read-only home still gets its figures, just not cached
    return dict(cache[key])


def work_figures(
    op: str, dims: dict[str, int], dtype: str, mode: str, median_ms: float | None, ceilings: dict[str, float]
) -> WorkFigures:
    """FLOP and bytes of one call, with the achieved rates and the roofline floor when a time is known; for a training
    step (an op with a contract's ``training``, mode fwd+bwd) its tokens (B*T) per second; for a decode
    step also its microseconds, new tokens (B*T) per second and state bandwidth (the work model's ``state_bytes``,
    the state read and written once) with its share of the measured copy ceiling."""
    w = work(op, dims, dtype, mode)
    fig = WorkFigures(flops=w["flops"], bytes=w["bytes"])
    if not median_ms or median_ms <= 0:
        return fig
    seconds = median_ms / 1e3
    fig.tflops = w["flops"] / seconds / 1e12
    fig.gbps = w["bytes"] / seconds / 1e9
    peak, bw = ceilings.get("matmul_tflops"), ceilings.get("copy_gbps")
    if mode == "fwd+bwd" and get_op(op).training is not None:
        fig.tokens_per_s = dims["B"] * dims["T"] / seconds  # a training step's tokens (its contract's training)
    if mode == "decode":
        fig.us_per_step = median_ms * 1e3
        fig.tokens_per_s = dims["B"] * dims["T"] / seconds
        fig.state_gbps = w["state_bytes"] / seconds / 1e9
        fig.pct_of_copy = 100 * fig.state_gbps / bw if bw else None
    if peak and bw:
        fig.floor_ms = max(w["flops"] / (peak * 1e12), w["bytes"] / (bw * 1e9)) * 1e3
        fig.pct_of_floor = 100 * fig.floor_ms / median_ms
    return fig
