"""Planted bugs for deltabench's Pallas GDN-2 kernels (the TPU and GPU forms share these helpers): each patched
into the shared forward helpers, the kernels registered under a name of their own, all undone afterwards."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import jax
import jax.numpy as jnp
import pytest

from deltabench.harness import register_impl
from deltabench.harness import registry as _registry
from deltabench.kernels.gdn2.jax.pallas import forward as pallas_forward

BUGS = ("wrong_decay", "dropped_last_block")


def decay_one_token_late(g: jax.Array) -> jax.Array:
    """The cumulative decay without the current token's gate (an exclusive cumsum): a wrong decay."""
    C = g.shape[0]
    i = jax.lax.broadcasted_iota(jnp.int32, (C, C), 0)
    j = jax.lax.broadcasted_iota(jnp.int32, (C, C), 1)
    return pallas_forward._dot(jnp.where(i > j, 1.0, 0.0).astype(jnp.float32), g)


def chunks_rounded_down(T: int, chunk: int) -> int:
    """The chunk count over whole chunks only (floor instead of ceil): the partial last block is never run."""
    return T // chunk


def planting(monkeypatch: pytest.MonkeyPatch, make_op: Callable[[str], object], name: str) -> Iterator[Callable]:
    """A fixture body: yields `plant(bug)`, which patches `bug` (one of :data:`BUGS`) into the shared helpers and
    registers ``make_op(bug)`` as ``gdn2/<name>``; removes it and undoes the patch afterwards."""

    def plant(bug: str) -> None:
        if bug == "wrong_decay":
            monkeypatch.setattr(pallas_forward, "_cumulative_decay", decay_one_token_late)
        else:
            monkeypatch.setattr(pallas_forward, "_num_chunks", chunks_rounded_down)
        jax.clear_caches()  # the jitted kernels would otherwise replay the correct ones
        register_impl("gdn2", name, backend="jax", devices=("cpu",), dtypes=("fp32", "bf16"))(make_op(bug))

    yield plant
    _registry._REGISTRY.pop(("gdn2", name), None)
    monkeypatch.undo()
    jax.clear_caches()
