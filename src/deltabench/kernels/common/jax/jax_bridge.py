"""The torch-facing face of deltabench's JAX kernels.

deltabench's registry calls every impl with PyTorch tensors (the verification engine and the runners build
torch inputs), so each JAX op is wrapped in a :class:`TorchFacingJaxOp`:

- tensors cross over without a detour through the host when they can: through numpy on the CPU (a bf16
  tensor travels as its raw 16-bit pattern, viewed as ``ml_dtypes.bfloat16``), the inputs of one call in one
  batched transfer; through DLPack on CUDA, both ways with no host synchronisation: each side's stream waits for
  the other's on the device (DLPack's stream handshake), so a training step queues its torch and JAX work
  without the host waiting for the GPU;
- a call whose inputs need a gradient goes through a ``torch.autograd.Function``: its forward runs the jitted
  ``jax.vjp`` of the op, which returns the outputs and the residuals the gradient needs; the residuals stay JAX
  arrays on the device, freed after the backward as torch frees its own saved tensors; its backward runs the
  jitted pullback over them. The forward runs once per forward and
  backward, as in a JAX training step; the price is the residuals' memory between the two, as in any training
  framework. A call that needs no gradient runs the forward alone and keeps nothing. The float64-oracle gate
  checks the forward and every gradient of the JAX code itself;
- the pure-JAX jitted functions stay reachable (``wrapper.jax_fn``, ``wrapper.jax_vjp``, ``wrapper.jax_pull``,
  ``wrapper.jax_fwd_bwd``) so that the JAX runner times native JAX, with no conversion in the timed region; the
  torch-facing forward and backward run these very functions, so at the job's own case the gate checks the programs
  the runner times;
- inside :func:`cheap_compiles` (the runner's correctness gate on the CPU), a torch-facing call whose program
  the op has not compiled as usual yet is compiled with XLA's cheap CPU settings
  (:func:`.jax_compile.cheap_cpu_compile_options`), about ten times faster; a program compiled as usual before
  (the job's first call, the one its timing runs) is reused as it is.

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

from .jax_compile import cheap_cpu_compile_options, configure_compilation

__all__ = ["TorchFacingJaxOp", "cheap_compiles", "jax_device", "jax_to_torch", "placed_on", "torch_to_jax"]

configure_compilation()  # persistent cache; cheap CPU compiles when DELTABENCH_JAX_FAST_COMPILE=1

# deltabench's platform names -> JAX's ("cuda" is JAX's "gpu")
_JAX_PLATFORM = {"cpu": "cpu", "cuda": "gpu", "gpu": "gpu", "tpu": "tpu"}
# (platform, index) host tensors are committed to; the host unless a caller placed the op elsewhere
_HOST_TARGET: contextvars.ContextVar[tuple[str, int]] = contextvars.ContextVar("jax_host_target", default=("cpu", 0))
# whether torch-facing calls compile their new CPU programs cheaply (see cheap_compiles)
_CHEAP: contextvars.ContextVar[bool] = contextvars.ContextVar("jax_cheap_compiles", default=False)


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


@contextlib.contextmanager
def cheap_compiles() -> Iterator[None]:
    """Inside: a torch-facing call of a :class:`TorchFacingJaxOp` on the CPU whose program (its argument shapes,
    dtypes, initial state and ``scale``) the op has not compiled as usual yet in this process is compiled with
    XLA's cheap CPU settings: the same HLO, about ten times faster to compile and slower to run. Programs
    compiled as usual before, such as the job's first call, which is the program its timing runs, are reused.

    The runner's correctness gate runs inside it on the CPU: besides the timed program it needs a dozen others
    per job (other lengths, an initial state, a non-default ``scale``, the backward), which it runs once each.
    Where this XLA lacks the options, everything compiles as usual."""
    token = _CHEAP.set(True)
    try:
        yield
    finally:
        _CHEAP.reset(token)


def _signature(tensors: Sequence[torch.Tensor | None], scale: float | None) -> tuple:
    """What makes jit compile a new program for a call on these torch tensors: shapes, dtypes, where they cross
    over to (a CUDA tensor's GPU, else the enclosing placement), which are absent, scale."""
    target = _HOST_TARGET.get()
    described = [
        None if t is None else (tuple(t.shape), str(t.dtype), str(t.device) if t.device.type == "cuda" else target)
        for t in tensors
    ]
    return repr(described), scale


def _on_cpu(t: torch.Tensor) -> bool:
    """Whether a call on torch tensor `t` runs on JAX's CPU."""
    return t.device.type != "cuda" and _HOST_TARGET.get()[0] == "cpu"


def torch_to_jax(x: torch.Tensor) -> jax.Array:
    """A JAX array holding the values of torch tensor `x`, same dtype: a CUDA tensor on its GPU; a host
    tensor on the device of the enclosing :func:`placed_on` (the CPU when none)."""
    x = x.detach()
    if x.device.type == "cuda":
        return _cuda_to_jax(x)
    return jax.device_put(_host_numpy(x), jax_device(*_HOST_TARGET.get()))


def _arguments(tensors: Sequence[torch.Tensor]) -> tuple[jax.Array, ...]:
    """:func:`torch_to_jax` of each tensor, the host ones in one batched ``jax.device_put``.

    Committed to their device, as the JAX runner's arguments are: jit compiles another program for arguments it
    would place itself (a numpy array, an uncommitted array), so the torch-facing calls would no longer run the
    programs the runner times."""
    if tensors[0].device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        # JAX's programs run on JAX's own stream and buffers, which torch's graph does not own: refused here, as
        # the host synchronisations the crossings once had made such a capture fail
        raise RuntimeError("a JAX impl cannot be captured in a torch CUDA graph: call it outside the capture")
    out: list[jax.Array | None] = [_cuda_to_jax(t.detach()) if t.device.type == "cuda" else None for t in tensors]
    host = [i for i, a in enumerate(out) if a is None]
    if host:
        put = jax.device_put([_host_numpy(tensors[i].detach()) for i in host], jax_device(*_HOST_TARGET.get()))
        for i, a in zip(host, put, strict=True):
            out[i] = a
    return tuple(a for a in out if a is not None)


def _cuda_to_jax(x: torch.Tensor) -> jax.Array:
    """A CUDA tensor as a JAX array on its GPU, sharing its memory, with no host synchronisation: JAX's
    ``from_dlpack`` hands torch the stream JAX's programs wait on, and torch's ``__dlpack__`` makes that stream
    wait for an event recorded on torch's current stream, so the JAX program reading `x` runs after the torch
    kernels that wrote it, on the device alone."""
    x = x.contiguous()
    if x.device.index == torch.cuda.current_device():
        return jax.dlpack.from_dlpack(x)
    with torch.cuda.device(x.device):  # torch exports only tensors of its current device
        return jax.dlpack.from_dlpack(x)


def _host_numpy(x: torch.Tensor) -> np.ndarray:
    """A host tensor's values as a numpy array (the tensor's own memory where it is contiguous)."""
    x = x.cpu().contiguous()
    if x.dtype == torch.bfloat16:
        # numpy has no bfloat16: ship the bit pattern and let ml_dtypes (JAX's own bf16 numpy type) reinterpret it.
        return x.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return x.numpy()


def jax_to_torch(a: jax.Array, device: torch.device | str) -> torch.Tensor:
    """A torch tensor on `device` holding the values of JAX array `a`, same dtype.

    On CUDA it shares `a`'s memory, with no host synchronisation: torch's ``from_dlpack`` hands JAX torch's
    current stream, which JAX makes wait until `a` is computed, so torch's kernels that read it run after."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.from_dlpack(a)
    arr = np.array(a, copy=True)  # writable and owned, so torch may keep it
    if arr.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16).to(dev)
    return torch.from_numpy(arr).to(dev)


def _vjp_of(core: Callable[..., tuple[jax.Array, jax.Array]]) -> Callable[..., tuple[Any, ...]]:
    """``(args, initial_state, scale) -> (o, final_state, pullback)``: the forward, keeping what its gradient needs.
    ``pullback`` is the ``jax.vjp`` pullback, a pytree whose leaves are the residuals (device arrays), so it can
    leave a jitted program and enter another (:func:`_pull_of`)."""

    def vjp(
        args: tuple[jax.Array, ...], initial_state: jax.Array | None = None, scale: float | None = None
    ) -> tuple[Any, ...]:
        primals = (*args, initial_state) if initial_state is not None else tuple(args)
        n = len(args)

        def run(*p: jax.Array) -> tuple[jax.Array, jax.Array]:
            return core(*p[:n], scale=scale, initial_state=p[n] if len(p) > n else None)

        (o, final_state), pullback = jax.vjp(run, *primals)
        return o, final_state, pullback

    return vjp


def _pull_of() -> Callable[..., tuple[jax.Array, ...]]:
    """``(pullback, do, dfinal) -> grads``: the gradients from a forward's residuals, one per argument, then the
    initial state's when one was given, for the cotangents ``do`` on o and ``dfinal`` on the final state. A
    function of its own for each op, so that each op's jitted pullback programs are its own."""

    def pull(pullback: Callable[..., tuple[jax.Array, ...]], do: jax.Array, dfinal: jax.Array) -> tuple[jax.Array, ...]:
        return pullback((do, dfinal))

    return pull


def _fwd_bwd_of(core: Callable[..., tuple[jax.Array, jax.Array]]) -> Callable[..., tuple[Any, ...]]:
    """``(args, do, initial_state, dfinal, scale) -> (o, final_state, grads)``: :func:`_vjp_of` and
    :func:`_pull_of` in one program, with zeros on the final state when ``dfinal`` is None (then the gradient of
    ``sum(o * do)``): a JAX user's jitted training step."""
    vjp = _vjp_of(core)

    def fwd_bwd(
        args: tuple[jax.Array, ...],
        do: jax.Array,
        initial_state: jax.Array | None = None,
        dfinal: jax.Array | None = None,
        scale: float | None = None,
    ) -> tuple[Any, ...]:
        o, final_state, pullback = vjp(args, initial_state, scale)
        grads = pullback((do, jnp.zeros_like(final_state) if dfinal is None else dfinal))
        return o, final_state, grads

    return fwd_bwd


class _JaxAutograd(torch.autograd.Function):
    """Forward through the jitted JAX forward that keeps its residuals (``jax_vjp``); backward through the jitted
    pullback over them (``jax_pull``): the forward runs once per forward and backward.

    The residuals stay JAX arrays on their device, held by the context: handing each to torch and back through
    DLPack cost about 0.15 ms of host time a buffer (profiled on the CPU; jax_chunk keeps 31), more than its
    programs at small shapes. Torch frees its own saved tensors right after a backward unless the graph is
    retained; the residuals follow the same rule (:func:`_free_unless_retained`).

    On CUDA each of its two JAX programs takes tensors torch has just handed over (the inputs; the cotangents), so
    it starts only once torch's stream has passed that point, and torch reads its outputs only once they are
    written: no host synchronisation, and memory freed on one side is not rewritten by the other while in use."""

    @staticmethod
    def forward(ctx: Any, op: TorchFacingJaxOp, scale: float | None, has_h0: bool, *tensors: torch.Tensor) -> Any:
        device = tensors[0].device
        crossed = _arguments(tensors)
        jargs, jh0 = (crossed[:-1], crossed[-1]) if has_h0 else (crossed, None)
        signature = _signature(tensors if has_h0 else (*tensors, None), scale)
        on_cpu = _on_cpu(tensors[0])
        o, final_state, pullback = op.program("vjp", signature, on_cpu=on_cpu)(jargs, jh0, scale=scale)
        # an empty tensor saved the torch way: torch frees it with the graph's saved tensors, which tells the
        # backward whether the graph was retained, and raises torch's own error on a backward through a freed graph
        ctx.save_for_backward(torch.empty(0))
        ctx.pullback = pullback
        ctx.op, ctx.signature, ctx.on_cpu, ctx.device = op, signature, on_cpu, device
        outs = (jax_to_torch(o, device), jax_to_torch(final_state, device))
        return outs

    @staticmethod
    def backward(ctx: Any, do: torch.Tensor, dfinal: torch.Tensor) -> Any:
        ctx.saved_tensors  # noqa: B018 -- raises torch's error when the graph's saved tensors were freed
        # torch hands zeros for an output the loss left unused (it materialises missing gradients), each of its
        # output's dtype: the cotangents cross as they come
        jdo, jdfinal = _arguments((do, dfinal))
        pull = ctx.op.program("pull", ctx.signature, on_cpu=ctx.on_cpu)
        grads = pull(ctx.pullback, jdo, jdfinal)
        _free_unless_retained(ctx)
        wanted = ctx.needs_input_grad[3:]
        return (
            None,
            None,
            None,
            *(jax_to_torch(g, ctx.device) if w else None for g, w in zip(grads, wanted, strict=True)),
        )


def _free_unless_retained(ctx: Any) -> None:
    """Once this backward pass ends, drop `ctx`'s residuals if torch freed the graph's saved tensors (no
    ``retain_graph``): their memory goes back as a torch tensor's would, not when the graph object is dropped."""

    def drop() -> None:
        try:
            ctx.saved_tensors  # noqa: B018
        except RuntimeError:  # freed: no later backward can run through this node
            ctx.pullback = None

    # the engine's end-of-pass callbacks run after it released (or kept) each node's saved tensors; torch has no
    # public word on whether this pass retains the graph
    torch.autograd.Variable._execution_engine.queue_callback(drop)


class TorchFacingJaxOp:
    """A JAX op made callable with torch tensors: ``op(q, k, v, *gates, scale=None, initial_state=None)``.

    Args:
        core: the pure-JAX function ``core(q, k, v, *gates, scale=None, initial_state=None) -> (o, final_state)``.
        name: a readable name (shown in reprs and errors).
        gates: the op's gate argument names, in order (for the argument-count check).

    Attributes:
        jax_fn: ``jax.jit(core)`` (``scale`` static): native JAX in, native JAX out.
        jax_vjp: jitted ``(args, initial_state=None, scale=None) -> (o, final_state, pullback)``: the forward
            keeping its residuals (the leaves of ``pullback``). A torch-facing call whose inputs need a gradient
            runs it (and a call under ``torch.no_grad()`` runs ``jax_fn``, keeping nothing).
        jax_pull: jitted ``(pullback, do, dfinal) -> grads``: the gradients over those residuals, for ``do`` on o
            and ``dfinal`` on the final state. The torch-facing backward runs it: no second forward.
        jax_fwd_bwd: jitted ``(args, do, initial_state=None, dfinal=None, scale=None) -> (o, final_state, grads)``:
            the two in one program (a JAX user's jitted training step), zeros on the final state when ``dfinal``
            is None (then the gradient of ``sum(o * do)``).
    """

    def __init__(self, core: Callable[..., tuple[jax.Array, jax.Array]], *, name: str, gates: Sequence[str]) -> None:
        self.core = core
        self.name = name
        self.gates = tuple(gates)
        self.jax_fn = jax.jit(core, static_argnames=("scale",))
        self.jax_vjp = jax.jit(_vjp_of(core), static_argnames=("scale",))
        self.jax_pull = jax.jit(_pull_of())
        self.jax_fwd_bwd = jax.jit(_fwd_bwd_of(core), static_argnames=("scale",))
        self.__doc__ = core.__doc__
        self._usual: set[tuple[str, tuple]] = set()  # (kind, signature) that torch-facing calls compiled as usual
        self._cheap: dict[str, Callable[..., Any]] = {}  # kind -> the same function jitted with the cheap options

    def program(self, kind: str, signature: tuple, *, on_cpu: bool) -> Callable[..., Any]:
        """The jitted function a torch-facing call runs: `kind` ``"fn"`` (``jax_fn``), ``"vjp"`` (``jax_vjp``) or
        ``"pull"`` (``jax_pull``, `signature` its forward's), or inside :func:`cheap_compiles` on the CPU, for a
        `signature` not compiled as usual before, its twin jitted with the cheap options."""
        usual = {"fn": self.jax_fn, "vjp": self.jax_vjp, "pull": self.jax_pull}[kind]
        options = cheap_cpu_compile_options() if _CHEAP.get() and on_cpu else None
        if options is None or (kind, signature) in self._usual:
            self._usual.add((kind, signature))
            return usual
        if kind not in self._cheap:
            if kind == "pull":
                self._cheap[kind] = jax.jit(_pull_of(), compiler_options=options)
            else:
                body = self.core if kind == "fn" else _vjp_of(self.core)
                self._cheap[kind] = jax.jit(body, static_argnames=("scale",), compiler_options=options)
        return self._cheap[kind]

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
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            return _JaxAutograd.apply(self, scale, initial_state is not None, *tensors)
        return self._forward(tensors[: 3 + len(gates)], initial_state, scale)

    def _forward(
        self, args: Sequence[torch.Tensor], initial_state: torch.Tensor | None, scale: float | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The forward alone (``jax_fn``): no gradient asked for, so no residuals kept."""
        crossed = _arguments((*args, *(() if initial_state is None else (initial_state,))))
        jargs, jh0 = (crossed, None) if initial_state is None else (crossed[:-1], crossed[-1])
        fn = self.program("fn", _signature((*args, initial_state), scale), on_cpu=_on_cpu(args[0]))
        o, final_state = fn(*jargs, scale=scale, initial_state=jh0)
        device = args[0].device
        return jax_to_torch(o, device), jax_to_torch(final_state, device)

    def __repr__(self) -> str:
        return f"TorchFacingJaxOp({self.name})"
