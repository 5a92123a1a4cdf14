"""The torch-facing face of deltabench's JAX kernels.

deltabench's registry calls every impl with PyTorch tensors (the verification engine and the runners build
torch inputs), so each JAX op is wrapped in a :class:`TorchFacingJaxOp`:

- tensors cross over without a detour through the host when they can: through numpy on the CPU (a bf16
  tensor travels as its raw 16-bit pattern, viewed as ``ml_dtypes.bfloat16``), through DLPack on CUDA;
- the call goes through a ``torch.autograd.Function`` whose backward runs the jitted JAX vjp, so the
  float64-oracle gate checks the forward and every gradient of the JAX code itself;
- the pure-JAX jitted functions stay reachable (``wrapper.jax_fn``, ``wrapper.jax_vjp``,
  ``wrapper.jax_fwd_bwd``) so that the JAX runner times native JAX, with no conversion in the timed region.

Importing this module imports JAX. It sets ``XLA_PYTHON_CLIENT_PREALLOCATE=false`` first (unless the user
chose otherwise) because JAX would otherwise reserve most of a GPU's memory and starve PyTorch in the same
process; then it applies deltabench's compilation settings (:mod:`.jax_compile`: a persistent compilation cache,
and cheap CPU compiles when ``DELTABENCH_JAX_FAST_COMPILE=1``).
"""

from __future__ import annotations

import contextlib
import contextvars
import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import torch

from .jax_compile import configure_compilation

__all__ = ["TorchFacingJaxOp", "jax_device", "jax_to_torch", "placed_on", "torch_to_jax"]

configure_compilation()  # persistent cache; cheap CPU compiles when DELTABENCH_JAX_FAST_COMPILE=1

# deltabench's platform names -> JAX's ("cuda" is JAX's "gpu")
_JAX_PLATFORM = {"cpu": "cpu", "cuda": "gpu", "gpu": "gpu", "tpu": "tpu"}
# (platform, index) host tensors are committed to; the host unless a caller placed the op elsewhere
_HOST_TARGET: contextvars.ContextVar[tuple[str, int]] = contextvars.ContextVar("jax_host_target", default=("cpu", 0))


def jax_device(platform: str, index: int = 0) -> jax.Device:
    """The JAX device `index` of deltabench platform `platform` (``cpu``, ``cuda``, ``tpu``).

    Raises RuntimeError when JAX has no such device (no TPU, no GPU backend): a caller asked for a device this
    machine lacks, and nothing silently runs elsewhere.
    """
    name = _JAX_PLATFORM.get(platform)
    if name is None:
        raise ValueError(f"unknown platform {platform!r}: use one of cpu, cuda, tpu")
    devices = jax.devices(name)  # raises RuntimeError when that backend is absent
    if index >= len(devices):
        raise RuntimeError(f"JAX sees {len(devices)} {name} device(s), not device {index}")
    return devices[index]


@contextlib.contextmanager
def placed_on(platform: str, index: int = 0) -> Iterator[jax.Device]:
    """Inside: torch tensors on the host cross over to JAX device `index` of `platform`, so the jitted op
    computes there (a ``tpu`` case's torch inputs live on the host; its JAX impl must still run on the TPU).
    Tensors already on a GPU cross over through DLPack to that GPU whatever the placement."""
    device = jax_device(platform, index)
    token = _HOST_TARGET.set((platform, index))
    try:
        yield device
    finally:
        _HOST_TARGET.reset(token)


def torch_to_jax(x: torch.Tensor) -> jax.Array:
    """A JAX array holding the values of torch tensor `x`, same dtype: a CUDA tensor on its GPU; a host
    tensor on the device of the enclosing :func:`placed_on` (the CPU when none)."""
    x = x.detach()
    if x.device.type == "cuda":
        x = x.contiguous()
        # torch's producing kernels run on torch's stream, which JAX does not wait on: finish them first (this
        # path serves the correctness gate; the JAX timer never crosses over)
        torch.cuda.synchronize(x.device)
        return jax.dlpack.from_dlpack(x)
    x = x.cpu().contiguous()
    if x.dtype == torch.bfloat16:
        # numpy has no bfloat16: ship the bit pattern and let ml_dtypes (JAX's own bf16 numpy type) reinterpret it.
        arr = x.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    else:
        arr = x.numpy()
    return jax.device_put(arr, jax_device(*_HOST_TARGET.get()))


def jax_to_torch(a: jax.Array, device: torch.device | str) -> torch.Tensor:
    """A torch tensor on `device` holding the values of JAX array `a`, same dtype."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.from_dlpack(a.block_until_ready())  # likewise: JAX's stream done before torch reads
    arr = np.array(a, copy=True)  # writable and owned, so torch may keep it
    if arr.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16).to(dev)
    return torch.from_numpy(arr).to(dev)


def _vjp_of(core: Callable[..., tuple[jax.Array, jax.Array]]) -> Callable[..., tuple[Any, ...]]:
    """``(args, initial_state, (do, dfinal), scale) -> (grads of args..., grad of initial_state or None)``."""

    def vjp(
        args: tuple[jax.Array, ...],
        initial_state: jax.Array | None,
        cotangents: tuple[jax.Array, jax.Array],
        scale: float | None = None,
    ) -> tuple[Any, ...]:
        if initial_state is None:
            _, pull = jax.vjp(lambda *a: core(*a, scale=scale, initial_state=None), *args)
            return (*pull(cotangents), None)
        _, pull = jax.vjp(lambda *a: core(*a[:-1], scale=scale, initial_state=a[-1]), *args, initial_state)
        return tuple(pull(cotangents))

    return vjp


def _fwd_bwd_of(core: Callable[..., tuple[jax.Array, jax.Array]]) -> Callable[..., tuple[Any, ...]]:
    """``(args, do, initial_state, scale) -> (o, final_state, grads)``: the gradient of ``sum(o * do)``, the
    training step's forward and backward in one jitted call (the runner's fwd+bwd closure)."""

    def fwd_bwd(
        args: tuple[jax.Array, ...],
        do: jax.Array,
        initial_state: jax.Array | None = None,
        scale: float | None = None,
    ) -> tuple[Any, ...]:
        primals = (*args, initial_state) if initial_state is not None else tuple(args)
        n = len(args)

        def run(*p: jax.Array) -> tuple[jax.Array, jax.Array]:
            return core(*p[:n], scale=scale, initial_state=p[n] if len(p) > n else None)

        (o, final_state), pull = jax.vjp(run, *primals)
        grads = pull((do, jnp.zeros_like(final_state)))
        return o, final_state, grads

    return fwd_bwd


class _JaxAutograd(torch.autograd.Function):
    """Forward through the jitted JAX op; backward through its jitted vjp."""

    @staticmethod
    def forward(ctx: Any, op: TorchFacingJaxOp, scale: float | None, has_h0: bool, *tensors: torch.Tensor) -> Any:
        args, h0 = (tensors[:-1], tensors[-1]) if has_h0 else (tensors, None)
        device = args[0].device
        o, final_state = op.jax_fn(
            *(torch_to_jax(t) for t in args), scale=scale, initial_state=None if h0 is None else torch_to_jax(h0)
        )
        ctx.op, ctx.scale, ctx.has_h0 = op, scale, has_h0
        ctx.save_for_backward(*tensors)
        return jax_to_torch(o, device), jax_to_torch(final_state, device)

    @staticmethod
    def backward(ctx: Any, do: torch.Tensor | None, dfinal: torch.Tensor | None) -> Any:
        tensors = ctx.saved_tensors
        args, h0 = (tensors[:-1], tensors[-1]) if ctx.has_h0 else (tensors, None)
        v, q, k = args[2], args[0], args[1]
        if do is None:
            do = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=v.dtype, device=v.device)
        if dfinal is None:
            dfinal = torch.zeros(q.shape[0], q.shape[2], k.shape[-1], v.shape[-1], dtype=torch.float32, device=v.device)
        grads = ctx.op.jax_vjp(
            tuple(torch_to_jax(t) for t in args),
            None if h0 is None else torch_to_jax(h0),
            (torch_to_jax(do.to(v.dtype)), torch_to_jax(dfinal.to(torch.float32))),
            scale=ctx.scale,
        )
        device = v.device
        torch_grads = [jax_to_torch(g, device) for g in grads[: len(args)]]
        if ctx.has_h0:
            torch_grads.append(jax_to_torch(grads[-1], device))
        return (None, None, None, *torch_grads)


class TorchFacingJaxOp:
    """A JAX op made callable with torch tensors: ``op(q, k, v, *gates, scale=None, initial_state=None)``.

    Args:
        core: the pure-JAX function ``core(q, k, v, *gates, scale=None, initial_state=None) -> (o, final_state)``.
        name: a readable name (shown in reprs and errors).
        gates: the op's gate argument names, in order (for the argument-count check).

    Attributes:
        jax_fn: ``jax.jit(core)`` (``scale`` static): native JAX in, native JAX out.
        jax_vjp: jitted ``(args, initial_state, (do, dfinal), scale=None) -> grads`` (last: initial_state's or None).
        jax_fwd_bwd: jitted ``(args, do, initial_state=None, scale=None) -> (o, final_state, grads)``, the
            gradient of ``sum(o * do)``.
    """

    def __init__(self, core: Callable[..., tuple[jax.Array, jax.Array]], *, name: str, gates: Sequence[str]) -> None:
        self.core = core
        self.name = name
        self.gates = tuple(gates)
        self.jax_fn = jax.jit(core, static_argnames=("scale",))
        self.jax_vjp = jax.jit(_vjp_of(core), static_argnames=("scale",))
        self.jax_fwd_bwd = jax.jit(_fwd_bwd_of(core), static_argnames=("scale",))
        self.__doc__ = core.__doc__

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *gates: torch.Tensor,
        scale: float | None = None,
        initial_state: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the JAX op on torch tensors; returns torch ``(o, final_state)`` on the inputs' device, with autograd."""
        if len(gates) != len(self.gates):
            raise TypeError(f"{self.name} takes gates ({', '.join(self.gates)}), got {len(gates)} gate tensors")
        tensors = (q, k, v, *gates) + ((initial_state,) if initial_state is not None else ())
        scale = None if scale is None else float(scale)
        return _JaxAutograd.apply(self, scale, initial_state is not None, *tensors)

    def __repr__(self) -> str:
        return f"TorchFacingJaxOp({self.name})"
