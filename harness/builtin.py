"""Wires deltabench's own kernels and the external adapters into the impl registry.

Each impl is registered lazily (``lazy("module:function")``) so that `deltabench list` imports no kernel,
Triton or JAX, and availability is judged from what is installed and which device is asked for.
kernels/ never imports the harness: this module is the only bridge.
"""

from __future__ import annotations

from .cases import Case
from .registry import lazy, register_impl

ALL_DTYPES = ("fp32", "bf16", "fp16")

# --- PyTorch references: plain functions, CPU and CUDA, autograd backward ---------------------------------------
for _op, _mod in (("gdn", "gdn"), ("gdn2", "gdn2"), ("kda", "kda")):
    register_impl(_op, "torch_recurrent", backend="torch", devices=("cpu", "cuda"), dtypes=ALL_DTYPES)(
        lazy(f"deltabench.kernels.{_mod}.torch_recurrent:{_op}_torch_recurrent")
    )
    register_impl(_op, "torch_chunk", backend="torch", devices=("cpu", "cuda"), dtypes=ALL_DTYPES)(
        lazy(f"deltabench.kernels.{_mod}.torch_chunk:{_op}_torch_chunk")
    )


# --- Triton kernels (kernels/gdn/chunk.py, fused_recurrent.py) ---------------------------------------------------
def _triton_dims(case: Case) -> str | None:
    if case.K > 256 or case.V > 256:
        return f"K and V up to 256 (got K={case.K}, V={case.V})"
    return None


register_impl(
    "gdn",
    "triton_chunk",
    backend="triton",
    devices=("cuda", "cpu"),
    dtypes=ALL_DTYPES,
    constraint=_triton_dims,
    requires=("triton",),
)(lazy("deltabench.kernels.gdn.chunk:gdn_triton_chunk"))
register_impl(
    "gdn",
    "triton_recurrent",
    backend="triton",
    devices=("cuda", "cpu"),
    dtypes=ALL_DTYPES,
    supports_backward=False,
    constraint=_triton_dims,
    requires=("triton",),
)(lazy("deltabench.kernels.gdn.fused_recurrent:gdn_triton_recurrent"))

# --- JAX subjects (kernels/<op>/jax_*.py) --------------------------------------------------------------------------
# (section owned by the JAX work; see kernels/gdn/jax_chunk.py)

# --- External adapters (kernels/external/) --------------------------------------------------------------------------
# (section owned by the adapters work; each registered with requires=(its package,))
