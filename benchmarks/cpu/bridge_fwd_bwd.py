"""A PyTorch user's fwd+bwd through deltabench's JAX bridge, against the bridge's former backward and native JAX.

For each impl, in one process, samples interleaved (so the load of a shared machine falls on all alike):
- ``bridge``: the torch-facing call and ``torch.autograd.grad`` of ``sum(o * do)`` (what a PyTorch user pays);
- ``second forward``: the same through the bridge's former backward, which ran the forward again inside the
  one-program training step (``jax_fwd_bwd``) instead of keeping the forward's residuals;
- ``native fused``: ``jax_fwd_bwd`` on JAX arrays (a JAX user's jitted training step);
- ``native split``: ``jax_vjp`` then ``jax_pull`` on JAX arrays (the bridge's two programs, no crossing).
Medians of `--reps` samples after warmup, ms. Usage:
``python benchmarks/cpu/bridge_fwd_bwd.py [--shape 1,256,2,32,32] [--dtype fp32] [--reps 60]``.
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
import torch

from deltabench.harness.ops import get_op
from deltabench.kernels.common.jax.jax_bridge import jax_to_torch, torch_to_jax

IMPLS = {
    "gdn/jax_chunk": "deltabench.kernels.gdn.jax.jax_chunk:gdn_jax_chunk",
    "gdn2/jax_chunk": "deltabench.kernels.gdn2.jax.jax_chunk:gdn2_jax_chunk",
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


class _SecondForward(torch.autograd.Function):
    """The bridge's former autograd: forward through ``jax_fn``, backward through ``jax_fwd_bwd`` (a second
    forward inside the training step), inputs crossing over again in the backward."""

    @staticmethod
    def forward(ctx: Any, op: Any, *tensors: torch.Tensor) -> Any:
        o, final_state = op.jax_fn(*(torch_to_jax(t) for t in tensors))
        ctx.op = op
        ctx.save_for_backward(*tensors)
        return jax_to_torch(o, "cpu"), jax_to_torch(final_state, "cpu")

    @staticmethod
    def backward(ctx: Any, do: torch.Tensor, dfinal: torch.Tensor | None) -> Any:
        args = ctx.saved_tensors
        if dfinal is None:
            dfinal = torch.zeros(args[0].shape[0], args[0].shape[2], args[1].shape[-1], args[2].shape[-1])
        jargs = tuple(torch_to_jax(t) for t in args)
        _, _, grads = ctx.op.jax_fwd_bwd(jargs, torch_to_jax(do.to(args[2].dtype)), None, torch_to_jax(dfinal))
        return (None, *(jax_to_torch(g, "cpu") for g in grads))


def _sample_ms(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def main() -> None:
    """Print one line per impl: the medians (ms) and the bridge's ratios to its former self and to native JAX."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shape", default="1,256,2,32,32", help="B,T,H,K,V")
    parser.add_argument("--dtype", default="fp32", choices=sorted(DTYPES))
    parser.add_argument("--reps", type=int, default=60)
    opts = parser.parse_args()
    B, T, H, K, V = (int(x) for x in opts.shape.split(","))
    for name, target in IMPLS.items():
        module, _, attr = target.partition(":")
        op = getattr(importlib.import_module(module), attr)
        spec = get_op(name.split("/")[0])
        inputs = spec.make_inputs(B, T, H, K, V, dtype=DTYPES[opts.dtype], seed=0)
        leaves = [inputs[n].clone().requires_grad_(True) for n in spec.args]
        do = torch.randn(B, T, H, V, generator=torch.Generator().manual_seed(1)).to(DTYPES[opts.dtype])
        args = tuple(torch_to_jax(inputs[n]) for n in spec.args)
        jdo, dfinal = torch_to_jax(do), jnp.zeros((B, H, K, V), jnp.float32)

        def bridge() -> object:
            o, _ = op(*leaves)
            return torch.autograd.grad((o * do).sum(), leaves)

        def second_forward() -> object:
            o, _ = _SecondForward.apply(op, *leaves)
            return torch.autograd.grad((o * do).sum(), leaves)

        def split() -> object:
            _o, _s, pullback = op.jax_vjp(args, None)
            return jax.block_until_ready(op.jax_pull(pullback, jdo, dfinal))

        subjects = {
            "bridge": bridge,
            "second forward": second_forward,
            "native fused": lambda: jax.block_until_ready(op.jax_fwd_bwd(args, jdo, None, dfinal)),
            "native split": split,
        }
        samples: dict[str, list[float]] = {k: [] for k in subjects}
        for rep in range(opts.reps + 3):
            for key, fn in subjects.items():
                ms = _sample_ms(fn)
                if rep >= 3:  # the first three: compiles and warmup
                    samples[key].append(ms)
        med = {k: statistics.median(v) for k, v in samples.items()}
        cells = ", ".join(f"{k} {v:.2f}" for k, v in med.items())
        print(
            f"{name} {opts.shape} {opts.dtype}: {cells} ms; bridge / second forward "
            f"{med['bridge'] / med['second forward']:.2f}x, bridge / native fused {med['bridge'] / med['native fused']:.2f}x"
        )


if __name__ == "__main__":
    main()
