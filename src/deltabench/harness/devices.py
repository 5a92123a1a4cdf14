"""Devices: where a case runs, as one value (``cpu``, ``cuda``, ``tpu``, with an optional index), parsed here only.

A device names the platform the impl computes on, not where torch keeps the inputs: torch has no TPU, so a
``tpu`` case builds its torch inputs on the host and a JAX impl receives them on the TPU (see
:func:`placement`). Whether a device is present is asked here too (:func:`absent_reason`), so that a job for a
device this machine lacks ends ``unsupported`` with that reason instead of running somewhere else.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
from collections.abc import Iterator

from .errors import BadInput

__all__ = [
    "DEVICE_SHARE_ENV",
    "PLATFORMS",
    "Device",
    "absent_reason",
    "allocator_fraction",
    "default_device",
    "device_for_kind",
    "device_share",
    "keep_to_share",
    "parse_device",
    "parse_platform",
    "placement",
]

PLATFORMS = ("cpu", "cuda", "tpu")
# Set by whoever runs several processes on one device at once (`deltabench run --gate-workers N`: 1/N): the share
# of the device's memory this process may size its own allocations by.
DEVICE_SHARE_ENV = "DELTABENCH_DEVICE_SHARE"
# What a process on a GPU holds outside PyTorch's allocator: its CUDA context, loaded kernels (Triton's, cuBLAS's),
# library workspaces. Shares of 1/N summing to the whole device left nothing for these: five gates at a fifth each
# filled an H200 and ran each other out of memory below their own shares.
OUTSIDE_ALLOCATOR_BYTES = 2 * 2**30
NO_TPU = "no TPU visible to JAX"
NO_CUDA = "no CUDA device on this machine"


@dataclasses.dataclass(frozen=True)
class Device:
    """A platform (``cpu``, ``cuda`` or ``tpu``) and, optionally, which of its devices (``cuda:1``)."""

    platform: str
    index: int | None = None

    def __str__(self) -> str:
        return self.platform if self.index is None else f"{self.platform}:{self.index}"

    @property
    def torch_device(self) -> str:
        """Where torch holds this device's tensors: the GPU for ``cuda``, else the host (torch has no TPU)."""
        return str(self) if self.platform == "cuda" else "cpu"


def parse_device(text: str) -> Device:
    """``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"tpu"``... as a Device; BadInput naming the choices otherwise."""
    raw = str(text).strip().lower()
    platform, sep, index = raw.partition(":")
    if platform == "gpu":  # JAX's name for the CUDA platform
        platform = "cuda"
    if platform not in PLATFORMS or (sep and not index.isdigit()):
        raise BadInput(f"unknown device {text!r}: use one of {', '.join(PLATFORMS)} (optionally :index)")
    return Device(platform, int(index) if sep else None)


def parse_platform(text: str) -> str:
    """The platform of a device given where only a platform fits (a suite, a case, a command's ``--device``)."""
    device = parse_device(text)
    if device.index is not None:
        raise BadInput(
            f"device {text!r}: give a platform ({', '.join(PLATFORMS)}); choose a GPU with CUDA_VISIBLE_DEVICES"
        )
    return device.platform


def device_for_kind(device_kind: str) -> Device:
    """The device a queue's device kind runs on: ``cpu`` -> cpu; ``tpu``, ``tpu-v5e``... -> tpu; any other
    kind (``cuda``, ``h200``, a GPU class) -> cuda."""
    kind = device_kind.strip().lower()
    if kind == "cpu":
        return Device("cpu")
    if kind.startswith("tpu"):
        return Device("tpu")
    return Device("cuda")


def _jax_sees_tpu() -> bool:
    if importlib.util.find_spec("jax") is None:
        return False
    import jax

    try:
        return bool(jax.devices("tpu"))
    except RuntimeError:  # JAX raises when no backend of that platform initialises
        return False


def absent_reason(device: Device | str) -> str | None:
    """Why `device` is not present on this machine (``no TPU visible to JAX``...), or None when it is."""
    device = parse_device(device) if isinstance(device, str) else device
    if device.platform == "cuda":
        import torch

        if not torch.cuda.is_available():
            return NO_CUDA
        if device.index is not None and device.index >= torch.cuda.device_count():
            return f"no CUDA device {device.index} (this machine has {torch.cuda.device_count()})"
    elif device.platform == "tpu" and not _jax_sees_tpu():
        return NO_TPU
    return None


def default_device() -> Device:
    """The device a command uses when none is given: the GPU when torch sees one, else the host."""
    import torch

    return Device("cuda" if torch.cuda.is_available() else "cpu")


@contextlib.contextmanager
def placement(device: Device | str, backend: str) -> Iterator[None]:
    """Inside: a JAX impl (`backend` ``jax``) computes on the JAX device of `device`, its host inputs committed
    there (``jax.devices("cpu" | "gpu" | "tpu")``). Other backends need nothing: their tensors are already
    on the device."""
    device = parse_device(device) if isinstance(device, str) else device
    if backend != "jax":
        yield
        return
    from deltabench.kernels.common.jax.jax_bridge import placed_on

    with placed_on(device.platform, device.index or 0):
        yield


def device_share() -> float:
    """This process's share of its device, in (0, 1]: ``$DELTABENCH_DEVICE_SHARE``, else 1 (the device alone).

    Raises BadInput when the variable is set to anything else."""
    text = os.environ.get(DEVICE_SHARE_ENV, "").strip()
    if not text:
        return 1.0
    try:
        share = float(text)
    except ValueError:
        share = -1.0
    if not 0.0 < share <= 1.0:
        raise BadInput(f"{DEVICE_SHARE_ENV}={text!r}: expected a number in (0, 1]")
    return share


def keep_to_share(device: Device | str) -> float:
    """Hold this process's PyTorch allocator on `device` (its live tensors and the blocks it keeps cached, together)
    to :func:`device_share` of the device's memory less what the process holds outside the allocator
    (:func:`allocator_fraction`), when the share is below 1 and `device` is a CUDA GPU; returns the fraction set
    (1.0: none). Without this, processes sharing a GPU each keep what their largest allocation took and run the
    others out (nine of a hundred gates on one H200, eight gates at once); with it, a process at its share frees its
    own cached blocks first and runs out only when its live tensors exceed it."""
    device = parse_device(device) if isinstance(device, str) else device
    share = device_share()
    if share >= 1.0 or device.platform != "cuda":
        return 1.0
    import torch

    if not torch.cuda.is_available():
        return 1.0
    index = device.index or 0
    fraction = allocator_fraction(share, torch.cuda.get_device_properties(index).total_memory)
    torch.cuda.set_per_process_memory_fraction(fraction, index)
    return fraction


def allocator_fraction(share: float, total_bytes: int) -> float:
    """The fraction of a device of `total_bytes` that a process's allocator may hold when the process has `share`
    of it: the share less :data:`OUTSIDE_ALLOCATOR_BYTES` (what it holds outside the allocator), never below half
    the share; the whole share when it is 1 (the device alone).

    Example::

        >>> round(allocator_fraction(0.2, 140 * 2**30), 4)
        0.1857
    """
    if share >= 1.0:
        return 1.0
    return max(share - OUTSIDE_ALLOCATOR_BYTES / total_bytes, share / 2)
