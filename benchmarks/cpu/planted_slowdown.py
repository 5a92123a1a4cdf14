"""A planted slowdown for the gate's calibration: re-registers gdn ``torch_chunk`` under its own name with extra
work after each call, a busy-wait of ``DELTABENCH_PLANTED_SLOWDOWN`` (a fraction, default 0.10) of the call's own
time, so the timing moves by that fraction whatever the machine's state.

    DELTABENCH_PLANTED_SLOWDOWN=0.10 deltabench run --suite benchmarks/cpu/gate-calibration.toml \\
        --import benchmarks/cpu/planted_slowdown.py --out head.json
"""

from __future__ import annotations

import os
import time
from typing import Any

from deltabench.harness.registry import get_impl, register_impl

FRACTION = float(os.environ.get("DELTABENCH_PLANTED_SLOWDOWN", "0.10"))
_original = get_impl("gdn", "torch_chunk")  # loads the built-ins first, so this registration replaces theirs


@register_impl(
    "gdn",
    "torch_chunk",
    backend=_original.backend,
    devices=_original.devices,
    dtypes=_original.dtypes,
    supports_backward=_original.supports_backward,
    constraint=_original.constraint,
    requires=_original.requires,
    notes=f"torch_chunk with a planted {FRACTION:.0%} slowdown",
)
def torch_chunk(*args: Any, **kwargs: Any) -> Any:
    """gdn torch_chunk, then a busy-wait of FRACTION of its own time (a sleep is too coarse below a millisecond)."""
    t0 = time.perf_counter()
    out = _original.fn(*args, **kwargs)
    end = time.perf_counter() + FRACTION * (time.perf_counter() - t0)
    while time.perf_counter() < end:
        pass
    return out
