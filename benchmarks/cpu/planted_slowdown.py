"""A planted slowdown for the gate's calibration: re-registers one impl under its own name with extra work after
each call, ``DELTABENCH_PLANTED_SLOWDOWN`` (a fraction, default 0.10) of the call's own time, so its timing moves by
that fraction whatever the machine's state. The extra work follows the forward call: a fwd+bwd job slows by
the fraction of its forward's share (about a third to a quarter of it for the chunked kernels).
``DELTABENCH_PLANTED_IMPL`` names it (``op/impl``, default ``gdn/torch_chunk``).

- CPU: a busy-wait of the fraction of the call's measured time (a sleep is too coarse below a millisecond).
- CUDA: ``torch.cuda._sleep`` enqueued after the call on the same stream, its cycle count set from the call's
  time measured with CUDA events once per input shape (the gate calls the impl at other shapes than the timed
  one, first) and with the GPU's clocks up (the sleep counts cycles: measured at idle clocks it came to a seventh
  of the planted time on the H200). The GPU work grows; the host never waits.

    DELTABENCH_PLANTED_SLOWDOWN=0.10 deltabench run --suite benchmarks/cpu/gate-calibration.toml \\
        --import benchmarks/cpu/planted_slowdown.py --out head.json
"""

from __future__ import annotations

import os
import time
from typing import Any

from deltabench.harness.registry import get_impl, register_impl

FRACTION = float(os.environ.get("DELTABENCH_PLANTED_SLOWDOWN", "0.10"))
OP, NAME = os.environ.get("DELTABENCH_PLANTED_IMPL", "gdn/torch_chunk").split("/")
_original = get_impl(OP, NAME)  # loads the built-ins first, so this registration replaces theirs
_cuda_cycles: dict[tuple[int, ...], int] = {}  # per shape of the first input, set on its first CUDA call


def _first_tensor_device(args: tuple[Any, ...]) -> str:
    for a in args:
        if hasattr(a, "device"):
            return str(a.device.type)
    return "cpu"


def _cycles_for(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """Sleep cycles worth FRACTION of one call, measured with CUDA events (median of 5 calls) after 20 calls
    that bring the clocks up."""
    import torch

    def ms(fn: Any) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end)

    for _ in range(20):
        _original.fn(*args, **kwargs)
    call_ms = sorted(ms(lambda: _original.fn(*args, **kwargs)) for _ in range(5))[2]
    per_ms = 1_000_000 / sorted(ms(lambda: torch.cuda._sleep(1_000_000)) for _ in range(5))[2]
    return max(1, int(FRACTION * call_ms * per_ms))


@register_impl(
    OP,
    NAME,
    backend=_original.backend,
    devices=_original.devices,
    dtypes=_original.dtypes,
    supports_backward=_original.supports_backward,
    constraint=_original.constraint,
    requires=_original.requires,
    notes=f"{NAME} with a planted {FRACTION:.0%} slowdown",
)
def planted(*args: Any, **kwargs: Any) -> Any:
    """The original impl, then FRACTION of its own time of extra work on the same device."""
    if _first_tensor_device(args) == "cuda":
        import torch

        shape = tuple(args[0].shape)
        if shape not in _cuda_cycles:
            _cuda_cycles[shape] = _cycles_for(args, kwargs)
        out = _original.fn(*args, **kwargs)
        torch.cuda._sleep(_cuda_cycles[shape])
        return out
    t0 = time.perf_counter()
    out = _original.fn(*args, **kwargs)
    end = time.perf_counter() + FRACTION * (time.perf_counter() - t0)
    while time.perf_counter() < end:
        pass
    return out
