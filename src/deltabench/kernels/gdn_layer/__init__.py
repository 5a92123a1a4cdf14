"""Impls of the GatedDeltaNet mixer block (``gdn_layer``): the block of references/gdn_layer.py in float32 around
a gdn impl's recurrence. ``torch_layer`` runs gdn's ``torch_chunk``; ``layer:<gdn impl>`` runs the gdn impl of that
name, for every other PyTorch or Triton gdn impl that has a backward and runs every mode (``layer:triton_chunk``: the
Triton chunked kernels, under the interpreter on the CPU). Each takes its gdn impl's devices, dtypes, requirements
and constraint."""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from typing import Any

import torch

from deltabench.references.gdn_layer import gdn_layer_block

from ..declare import ImplDecl
from ..gdn import IMPLS as GDN_IMPLS

__all__ = ["IMPLS", "layer_over", "torch_layer"]

_HERE = "deltabench.kernels.gdn_layer"
# The prefix of the impls named after the gdn impl they run, and of the functions their targets name.
PREFIX = "layer:"
_FN_PREFIX = "layer_over_"


def layer_over(gdn_impl: str, x: torch.Tensor, *weights: torch.Tensor, **kwargs: Any) -> tuple[Any, Any]:
    """The block in float32 around the gdn impl named `gdn_impl` (its declared target); y in x's dtype."""
    (decl,) = [d for d in GDN_IMPLS if d.name == gdn_impl]
    module, fn = decl.target.split(":")
    recurrence = getattr(importlib.import_module(module), fn)
    y, state = gdn_layer_block(recurrence, torch.float32, x, *weights, **kwargs)
    return y.to(x.dtype), state


def torch_layer(x: torch.Tensor, *weights: torch.Tensor, **kwargs: Any) -> tuple[Any, Any]:
    """The block over gdn's ``torch_chunk``."""
    return layer_over("torch_chunk", x, *weights, **kwargs)


def __getattr__(name: str) -> Callable[..., Any]:
    """``layer_over_<gdn impl>``: the block over that gdn impl (the targets of the ``layer:`` impls)."""
    gdn_impl = name.removeprefix(_FN_PREFIX)
    if name.startswith(_FN_PREFIX) and any(d.name == gdn_impl for d in GDN_IMPLS):

        def fn(x: torch.Tensor, *weights: torch.Tensor, **kwargs: Any) -> tuple[Any, Any]:
            return layer_over(gdn_impl, x, *weights, **kwargs)

        fn.__name__ = name
        return fn
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _layer_decl(gdn: ImplDecl) -> ImplDecl:
    """The ``layer:<name>`` impl over gdn impl `gdn`: its platforms and constraint, none of its varlen or notes."""
    return dataclasses.replace(
        gdn,
        op="gdn_layer",
        name=f"{PREFIX}{gdn.name}",
        target=f"{_HERE}:{_FN_PREFIX}{gdn.name}",
        varlen=False,
        notes=f"the block around gdn's {gdn.name}",
    )


IMPLS = (
    ImplDecl("gdn_layer", "torch_layer", f"{_HERE}:torch_layer", "torch", ("cpu", "cuda")),
    *(
        _layer_decl(d)
        for d in GDN_IMPLS
        if d.backend in ("torch", "triton")
        and d.backward
        and not d.modes
        and not d.state_in_place
        and d.name != "torch_chunk"  # torch_layer
    ),
)
