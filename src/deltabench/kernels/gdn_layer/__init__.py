"""Impls of the GatedDeltaNet mixer block (``gdn_layer``): the block of references/gdn_layer.py in float32 around
a gdn impl's recurrence. ``torch_layer`` runs gdn's ``torch_chunk``; ``layer:<gdn impl>`` runs the gdn impl of that
name (``layer:triton_chunk``: the Triton chunked kernels, under the interpreter on the CPU)."""

from __future__ import annotations

import importlib
from typing import Any

import torch

from deltabench.references.gdn_layer import gdn_layer_block

from ..declare import TORCH_DEVICES, ImplDecl
from ..gdn import IMPLS as GDN_IMPLS

__all__ = ["IMPLS", "layer_over"]

_HERE = "deltabench.kernels.gdn_layer"


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


def triton_layer(x: torch.Tensor, *weights: torch.Tensor, **kwargs: Any) -> tuple[Any, Any]:
    """The block over gdn's ``triton_chunk``."""
    return layer_over("triton_chunk", x, *weights, **kwargs)


IMPLS = (
    ImplDecl("gdn_layer", "torch_layer", f"{_HERE}:torch_layer", "torch", TORCH_DEVICES),
    ImplDecl(
        "gdn_layer",
        "layer:triton_chunk",
        f"{_HERE}:triton_layer",
        "triton",
        ("cuda", "cpu"),
        requires=("triton",),
    ),
)
