"""A PyTorch user's fwd+bwd through deltabench's JAX bridge, against its former selves and native JAX.

For each impl, in one process, samples interleaved (so the load of a shared machine falls on all alike):
- ``bridge``: the torch-facing call and ``torch.autograd.grad`` of ``sum(o * do)`` (what a PyTorch user pays);
- ``synced crossings``: the same two programs with the bridge's former crossings, where the host waited for the
  device at each (``torch.cuda.synchronize`` before each input, ``block_until_ready`` on each output; on the CPU
  the inputs crossed one by one);
- ``second forward``: the bridge's backward before it kept the forward's residuals: it ran the forward again
  inside the one-program training step (``jax_fwd_bwd``);
- ``native fused``: ``jax_fwd_bwd`` on JAX arrays (a JAX user's jitted training step);
- ``native split``: ``jax_vjp`` then ``jax_pull`` on JAX arrays (the bridge's two programs, no crossing).
Before timing, the bridge's outputs and gradients are checked against the native step's (``max rel``: the largest
difference over the largest element, per tensor; on a GPU this catches a crossing that reads before the data is
written). Medians of `--reps` samples after warmup, ms, on the host clock (on CUDA each sample ends
synchronised). Usage: ``python benchmarks/cpu/bridge_fwd_bwd.py [--shape 1,256,2,32,32] [--dtype fp32]
[--reps 60] [--device cuda] [--impls gdn2/pallas_gpu_chunk,kda/pallas_gpu_chunk] [--torch-threads 1]``. On a
two-core CPU, torch's intra-op threads (spinning after each torch op) contend with XLA's: ``--torch-threads 1``
leaves the cores to XLA (measured at 1x1024x4x64 fp32: the bridge's pullback 337 ms with torch's default threads,
220 with one, 223 natively).
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch

from deltabench.harness.ops import get_op
from deltabench.kernels.common.jax.jax_bridge import jax_to_torch, torch_to_jax

IMPLS = {
    "gdn/jax_chunk": "deltabench.kernels.gdn.jax.jax_chunk:gdn_jax_chunk",
    "gdn2/jax_chunk": "deltabench.kernels.gdn2.jax.jax_chunk:gdn2_jax_chunk",
    "gdn2/pallas_gpu_chunk": "deltabench.kernels.gdn2.jax.pallas.gpu_chunk:gdn2_pallas_gpu_chunk",
    "kda/pallas_gpu_chunk": "deltabench.kernels.gdn2.jax.pallas.gpu_chunk:kda_pallas_gpu_chunk",
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


class _SecondForward(torch.autograd.Function):
    """The bridge's former autograd: forward through ``jax_fn``, backward through ``jax_fwd_bwd`` (a second
    forward inside the training step), inputs crossing over again in the backward."""

    @staticmethod
    def forward(ctx: Any, op: Any, *tensors: torch.Tensor) -> Any:
        o, final_state = op.jax_fn(*(torch_to_jax(t) for t in tensors))
        ctx.op, ctx.device = op, tensors[0].device
        ctx.save_for_backward(*tensors)
        return jax_to_torch(o, ctx.device), jax_to_torch(final_state, ctx.device)

    @staticmethod
    def backward(ctx: Any, do: torch.Tensor, dfinal: torch.Tensor | None) -> Any:
        args = ctx.saved_tensors
        if dfinal is None:
            B, _, H, K = args[1].shape
            dfinal = torch.zeros(B, H, K, args[2].shape[-1], device=ctx.device)
        jargs = tuple(torch_to_jax(t) for t in args)
        _, _, grads = ctx.op.jax_fwd_bwd(jargs, torch_to_jax(do.to(args[2].dtype)), None, torch_to_jax(dfinal))
        return (None, *(jax_to_torch(g, ctx.device) for g in grads))


def _synced_to_jax(t: torch.Tensor) -> jax.Array:
    if t.is_cuda:
        torch.cuda.synchronize(t.device)
    return torch_to_jax(t)


def _synced_to_torch(a: jax.Array, device: torch.device) -> torch.Tensor:
    return jax_to_torch(a.block_until_ready(), device)


class _SyncedCrossings(torch.autograd.Function):
    """The bridge's autograd (``jax_vjp`` forward, ``jax_pull`` backward) with its former crossings: the host
    waited for the device before each input crossed and after each output was computed."""

    @staticmethod
    def forward(ctx: Any, op: Any, *tensors: torch.Tensor) -> Any:
        o, final_state, ctx.pullback = op.jax_vjp(tuple(_synced_to_jax(t) for t in tensors), None)
        ctx.op, ctx.device, ctx.final_shape = op, tensors[0].device, tuple(final_state.shape)
        return _synced_to_torch(o, ctx.device), _synced_to_torch(final_state, ctx.device)

    @staticmethod
    def backward(ctx: Any, do: torch.Tensor, dfinal: torch.Tensor | None) -> Any:
        if dfinal is None:
            dfinal = torch.zeros(ctx.final_shape, device=ctx.device)
        grads = ctx.op.jax_pull(ctx.pullback, _synced_to_jax(do), _synced_to_jax(dfinal))
        return (None, *(_synced_to_torch(g, ctx.device) for g in grads))


def _max_rel(got: torch.Tensor, want: jax.Array) -> float:
    """The largest difference over the largest element of `want`."""
    w = torch.from_numpy(np.array(want.astype(jnp.float32)))
    return float((got.detach().float().cpu() - w).abs().max() / w.abs().max().clamp_min(1e-30))


def _sample_ms(fn: Callable[[], object], device: str) -> float:
    t0 = time.perf_counter()
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3


def _medians(
    name: str, shape: tuple[int, ...], dtype: torch.dtype, device: str, reps: int
) -> tuple[dict[str, float], float]:
    """The subjects' median ms for impl `name` ("op/impl") at `shape` (B, T, H, K, V), and the bridge's largest
    relative difference from the native step (outputs and gradients)."""
    B, T, H, K, V = shape
    module, _, attr = IMPLS[name].partition(":")
    op = getattr(importlib.import_module(module), attr)
    spec = get_op(name.split("/")[0])
    made = spec.make_inputs(B, T, H, K, V, dtype=dtype, seed=0)
    inputs = {n: t.to(device) for n, t in made.items() if isinstance(t, torch.Tensor)}
    leaves = [inputs[n].clone().requires_grad_(True) for n in spec.args]
    do = torch.randn(B, T, H, V, generator=torch.Generator().manual_seed(1)).to(device, dtype)
    args = tuple(torch_to_jax(inputs[n]) for n in spec.args)
    jdo = torch_to_jax(do)
    dfinal = jax.device_put(jnp.zeros((B, H, K, V), jnp.float32), args[0].devices().pop())

    def bridge() -> object:
        o, _ = op(*leaves)
        return torch.autograd.grad((o * do).sum(), leaves)

    def synced() -> object:
        o, _ = _SyncedCrossings.apply(op, *leaves)
        return torch.autograd.grad((o * do).sum(), leaves)

    def second_forward() -> object:
        o, _ = _SecondForward.apply(op, *leaves)
        return torch.autograd.grad((o * do).sum(), leaves)

    def fused() -> object:
        return jax.block_until_ready(op.jax_fwd_bwd(args, jdo, None, dfinal))

    def split() -> object:
        _o, _s, pullback = op.jax_vjp(args, None)
        return jax.block_until_ready(op.jax_pull(pullback, jdo, dfinal))

    subjects = {
        "bridge": bridge,
        "synced crossings": synced,
        "second forward": second_forward,
        "native fused": fused,
        "native split": split,
    }
    samples: dict[str, list[float]] = {k: [] for k in subjects}
    for rep in range(reps + 3):
        for key, fn in subjects.items():
            ms = _sample_ms(fn, device)
            if rep >= 3:  # the first three: compiles and warmup
                samples[key].append(ms)
    return {k: statistics.median(v) for k, v in samples.items()}, _check(op, leaves, do, fused())


def _check(op: Any, leaves: list[torch.Tensor], do: torch.Tensor, native: tuple) -> float:
    """The bridge's largest relative difference from the native step's outputs and gradients, on inputs and a
    cotangent that torch writes just before the call, behind a GPU sleep on torch's stream: a JAX program that did
    not wait for torch's stream would read them unwritten."""
    if do.is_cuda:
        torch.cuda._sleep(100_000_000)  # about 50 ms of the GPU's clock on torch's stream
    fresh = [(t.detach() * 1).requires_grad_(True) for t in leaves]
    o, _ = op(*fresh)
    got = [o, *torch.autograd.grad((o * (do * 1)).sum(), fresh)]
    o_ref, _, grads_ref = native
    return max(_max_rel(g, w) for g, w in zip(got, [o_ref, *grads_ref], strict=True))


def main() -> None:
    """Print one line per impl: the medians (ms) and the bridge's ratios to its former self and to native JAX."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shape", default="1,256,2,32,32", help="B,T,H,K,V")
    parser.add_argument("--dtype", default="fp32", choices=sorted(DTYPES))
    parser.add_argument("--reps", type=int, default=60)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--impls", default="gdn/jax_chunk,gdn2/jax_chunk", help="op/impl, comma-separated")
    parser.add_argument("--torch-threads", type=int, default=0, help="torch's intra-op threads (0: its default)")
    opts = parser.parse_args()
    if opts.torch_threads:
        torch.set_num_threads(opts.torch_threads)
    shape = tuple(int(x) for x in opts.shape.split(","))
    for name in opts.impls.split(","):
        med, rel = _medians(name, shape, DTYPES[opts.dtype], opts.device, opts.reps)
        cells = ", ".join(f"{k} {v:.2f}" for k, v in med.items())
        ratios = ", ".join(f"{k} {med[k] / med['native fused']:.2f}x" for k in ("bridge", "synced crossings"))
        print(
            f"{name} {opts.shape} {opts.dtype} {opts.device}: {cells} ms; / native fused: {ratios}; "
            f"bridge vs native: max rel {rel:.1e}",
            flush=True,
        )


if __name__ == "__main__":
    main()
