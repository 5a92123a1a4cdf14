"""Impls of a small LM's training step (``lm_step``): the model of references/lm_step.py in float32, with a
registered gdn, gdn2 or kda impl as every block's mixer, called in the case's dtype (its q, k, v and beta; the
log-decay in float32, as every gdn impl takes it). ``<op>:<impl>`` runs that impl: ``gdn:torch_chunk`` (the
op's full-shape reference), ``gdn:triton_chunk``, ``gdn:triton_chunk_auto``, ``gdn:fla_chunk``, ``kda:torch_chunk``
... for every PyTorch or Triton impl of those ops that has a backward and runs every mode. Each takes its mixer's
devices, dtypes, requirements and constraint.

The block is gdn_layer's (one log-decay and one write strength per head), so a gdn2 or kda mixer is given those
gates broadcast over its channels: kda's ``g`` over K; gdn2's ``g`` and ``b`` over K and ``w`` over V, each
``beta``, with which gdn2's rule is gdn's. Its kernels do their own work on those inputs.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from typing import Any

import torch

from deltabench.references.lm_step import MIXER_DTYPES, lm_forward

from ..declare import ImplDecl
from ..external.fla import IMPLS as FLA_IMPLS
from ..external.opengdn import IMPLS as OPENGDN_IMPLS
from ..gdn import IMPLS as GDN_IMPLS
from ..gdn2 import IMPLS as GDN2_IMPLS
from ..kda import IMPLS as KDA_IMPLS

__all__ = ["IMPLS", "in_dtype", "lm_over", "mixer_of"]

_HERE = "deltabench.kernels.lm_step"
_FN_PREFIX = "lm__"  # lm__<op>__<impl>: the target of impl <op>:<impl>
_MIXER_OPS = ("gdn", "gdn2", "kda")
_MIXERS = tuple(
    d
    for d in (*GDN_IMPLS, *GDN2_IMPLS, *KDA_IMPLS, *FLA_IMPLS, *OPENGDN_IMPLS)
    if d.op in _MIXER_OPS and d.backend in ("torch", "triton") and d.backward and not d.modes and not d.state_in_place
)


def _over_k(x: torch.Tensor, n: int) -> torch.Tensor:
    """A per-head gate ``[B, T, H]`` as one per channel ``[B, T, H, n]`` (the same value on every channel)."""
    return x[..., None].expand(*x.shape, n).contiguous()


def mixer_of(op: str, impl: str) -> Callable[..., Any]:
    """Impl `impl` of op `op` (its declared target) as a gdn recurrence ``(q, k, v, g, beta, scale=,
    initial_state=)``: gdn's as it is, kda's and gdn2's with the gates broadcast (module docstring)."""
    (decl,) = [d for d in _MIXERS if d.op == op and d.name == impl]
    module, fn = decl.target.split(":")
    inner = getattr(importlib.import_module(module), fn)
    if op == "gdn":
        return inner

    def mixer(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, **kw: Any) -> Any:
        K, V = k.shape[-1], v.shape[-1]
        if op == "kda":
            return inner(q, k, v, _over_k(g, K), beta, **kw)
        return inner(q, k, v, _over_k(g, K), _over_k(beta, K), _over_k(beta, V), **kw)

    return mixer


def in_dtype(mixer: Callable[..., Any], dtype: torch.dtype) -> Callable[..., Any]:
    """`mixer` called with q, k, v and beta in `dtype` (g stays float32), its output returned in float32."""

    def cast(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, **kw: Any) -> Any:
        o, state = mixer(q.to(dtype), k.to(dtype), v.to(dtype), g, beta.to(dtype), **kw)
        return o.float(), state

    return cast


def lm_over(
    op: str,
    impl: str,
    tokens: torch.Tensor,
    targets: torch.Tensor,
    *params: torch.Tensor,
    mixer_dtype: str = "fp32",
    initial_state: torch.Tensor | None = None,
) -> Any:
    """The model in float32 with impl `impl` of `op` as its mixer, called in `mixer_dtype`."""
    mixer = in_dtype(mixer_of(op, impl), MIXER_DTYPES[mixer_dtype])
    return lm_forward(mixer, torch.float32, tokens, targets, *params, initial_state=initial_state)


def __getattr__(name: str) -> Callable[..., Any]:
    """``lm__<op>__<impl>``: the model over that impl (the targets of the impls)."""
    op, _, impl = name.removeprefix(_FN_PREFIX).partition("__")
    if name.startswith(_FN_PREFIX) and any(d.op == op and d.name == impl for d in _MIXERS):

        def fn(tokens: torch.Tensor, targets: torch.Tensor, *params: torch.Tensor, **kw: Any) -> Any:
            return lm_over(op, impl, tokens, targets, *params, **kw)

        fn.__name__ = name
        return fn
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _lm_decl(mixer: ImplDecl) -> ImplDecl:
    """The ``<op>:<impl>`` impl over `mixer`: its platforms and constraint, none of its varlen."""
    broadcast = "" if mixer.op == "gdn" else " (per-head gates broadcast over its channels)"
    return dataclasses.replace(
        mixer,
        op="lm_step",
        name=f"{mixer.op}:{mixer.name}",
        target=f"{_HERE}:{_FN_PREFIX}{mixer.op}__{mixer.name}",
        varlen=False,
        notes=f"the model around {mixer.op}'s {mixer.name}{broadcast}",
    )


IMPLS = tuple(_lm_decl(d) for d in _MIXERS)
