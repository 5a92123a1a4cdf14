"""Adapters for FlashInfer's Gated DeltaNet decode kernels (PyPI ``flashinfer-python`` 0.7.2.post1, import name
``flashinfer``): CuTe DSL kernels (``nvidia-cutlass-dsl``) compiled on their first call, for SM90 and newer GPUs.

Two entry points of ``flashinfer.gdn_decode``, each mapped to deltabench's gdn decode contract
``fn(q, k, v, g, beta, scale=None, initial_state=None) -> (o, state)``:

* ``gated_delta_rule_decode`` (impl ``flashinfer_decode``): one new token (T = 1) from a float32 state laid out
  K-major, ``[B, HV, K, V]``, deltabench's own layout; the kernel writes the new state into the buffer it read
  (contiguous), so the impl is declared ``state_in_place``. It asserts K >= 128, V >= 128 and V % 32 == 0, and q,
  k, v in fp16 or bf16.
* ``gated_delta_rule_mtp`` (impl ``flashinfer_mtp``): T > 1 new tokens (multi-token prediction, speculative
  verification) from a float32 state pool laid out V-major, ``[pool, HV, V, K]``, addressed by per-row indices, the
  new state written back with ``disable_state_update=False``. deltabench's state is K-major, so the adapter copies
  it transposed into a V-major pool and the result transposed back into the buffer given: two more passes over the
  state than the kernel makes, inside the timed call. ``benchmarks/gpu/decode_adapters.py`` also times the kernel
  alone at its own layout.

What the mapping changes, and why:

* Gating. FlashInfer takes a layer's raw gate inputs and computes, per token and value head,
  ``g = -exp(A_log) * softplus(a + dt_bias)`` and ``beta = sigmoid(b)``, with ``a`` and ``b`` in fp16/bf16.
  deltabench's contract gives g (a log-decay, float32) and beta themselves, so :func:`flashinfer_gates` inverts
  that: ``A_log = dt_bias = 0``, ``a = log(expm1(-g))``, ``b = logit(beta)``, computed in float32 and rounded once
  to the inputs' dtype (FlashInfer's types). That rounding perturbs g and beta by about the inputs' own rounding;
  the gate judges the result like any other. The conversion is a few elementwise kernels on ``[B, T, H]`` per
  call, inside the timed call: a serving engine feeding raw gates would not pay them.
* Heads. FlashInfer takes more value heads than query/key heads (HV a multiple of H); deltabench's gdn contract has
  one head count, so HV = H here.
* q and k arrive L2-normalised: ``use_qk_l2norm=False``. The output comes back in v's dtype.
* ``backend="flashinfer"`` names the kernels measured (``auto`` may route an exact manifest shape elsewhere).

This module imports without FlashInfer installed; FlashInfer is imported on the first call, and where it does not
import, each impl is unsupported with the import error as its reason.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from ..common.decode import require_state_cache
from ..declare import ImplDecl

__all__ = [
    "IMPLS",
    "MIN_HEAD_DIM",
    "flashinfer_case",
    "flashinfer_gates",
    "gdn_flashinfer_decode",
    "gdn_flashinfer_mtp",
    "import_failure",
    "unsupported_reason",
]

MIN_HEAD_DIM = 128  # gdn_decode asserts K >= 128 and V >= 128
# gated_delta_rule_decode asserts V % 32 == 0 (its large-batch V tile); the MTP kernel asserts V a multiple of the V
# tile it picks for B and T, which the package does not state in advance: 32 is required of both here
V_TILE = 32
_gate_params: dict[tuple[torch.device, int], torch.Tensor] = {}


def import_failure() -> str | None:
    """Why ``flashinfer.gdn_decode`` does not import here (the first line of the error), or None when it does."""
    try:
        importlib.import_module("flashinfer.gdn_decode")
    except Exception as exc:  # any import failure (the package, CuTe DSL, tvm-ffi) is the reason it cannot run
        return f"flashinfer.gdn_decode does not import: {type(exc).__name__}: {exc}".splitlines()[0]
    return None


def unsupported_reason(
    *, entry: str, T: int, K: int, V: int, dtype: str, device: str, capability: tuple[int, int] | None
) -> str | None:
    """Why FlashInfer's `entry` (``decode`` or ``mtp``) cannot run a case, or None (its import is not judged here).

    `capability` is the GPU's ``torch.cuda.get_device_capability()`` (None when unknown)."""
    if device != "cuda":
        return f"FlashInfer's GDN decode kernels run on NVIDIA GPUs only (SM90+), not {device}"
    if capability is not None and tuple(capability) < (9, 0):
        return f"FlashInfer's GDN decode kernels need an SM90+ GPU (this is sm_{capability[0]}{capability[1]})"
    if dtype not in ("bf16", "fp16"):
        return f"FlashInfer's GDN decode takes q, k, v in fp16 or bf16, not {dtype}"
    if entry == "decode" and T != 1:
        return f"gated_delta_rule_decode takes one new token (T = 1), got T={T}: flashinfer_mtp takes T > 1"
    if entry == "mtp" and T == 1:
        # FlashInfer documents its MTP kernel for T > 1 (speculative verification) and routes T = 1 elsewhere
        return "gated_delta_rule_mtp is FlashInfer's multi-token path (T > 1): flashinfer_decode takes T = 1"
    if K < MIN_HEAD_DIM or V < MIN_HEAD_DIM:
        return f"FlashInfer's GDN decode needs K and V of at least {MIN_HEAD_DIM} (got K={K}, V={V})"
    if V % V_TILE:
        return f"FlashInfer's GDN decode needs V a multiple of {V_TILE} (got V={V})"
    return None


def _case_constraint(entry: str) -> Any:
    def constraint(case: Any) -> str | None:
        return flashinfer_case(case, entry)

    return constraint


def flashinfer_case(case: Any, entry: str) -> str | None:
    """:func:`unsupported_reason` for `case`, with the GPU's capability where it runs on one, then the import."""
    capability = None
    if case.device == "cuda" and torch.cuda.is_available():
        capability = torch.cuda.get_device_capability()
    why = unsupported_reason(
        entry=entry, T=case.T, K=case.K, V=case.V, dtype=case.dtype, device=case.device, capability=capability
    )
    return why or import_failure()


def flashinfer_gates(
    g: torch.Tensor, beta: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """FlashInfer's ``(A_log, a, dt_bias, b)`` that give back deltabench's `g` (log-decay ``[B, T, H]``) and `beta`.

    With ``A_log = dt_bias = 0`` (float32 ``[H]``), FlashInfer's ``-exp(A_log) * softplus(a + dt_bias)`` is g for
    ``a = log(expm1(-g))``, and its ``sigmoid(b)`` is beta for ``b = logit(beta)``; a and b are computed in float32
    and rounded once to `dtype`. g = 0 gives a = -inf (softplus(-inf) = 0) and beta = 1 gives b = +inf (sigmoid = 1),
    both exact.

    Examples::

        >>> A_log, a, dt_bias, b = flashinfer_gates(g, beta, torch.bfloat16)
    """
    H = g.shape[-1]
    key = (g.device, H)
    zeros = _gate_params.get(key)
    if zeros is None:  # a constant: one tensor of zeros per device and head count, never written
        zeros = _gate_params[key] = torch.zeros(H, dtype=torch.float32, device=g.device)
    a = g.float().neg().expm1_().log_().to(dtype)
    b = torch.logit(beta.float()).to(dtype)
    return zeros, a, zeros, b


def gdn_flashinfer_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One new token through ``flashinfer.gdn_decode.gated_delta_rule_decode`` (K-major state, in place).

    Args:
        q, k: ``[B, 1, H, K]`` fp16/bf16, already L2-normalised. v: ``[B, 1, H, V]``, same dtype.
        g: ``[B, 1, H]`` log-decay (float32). beta: ``[B, 1, H]``.
        scale: default ``K ** -0.5``. initial_state: ``[B, H, K, V]`` float32 contiguous, updated in place.

    Returns:
        ``(o, initial_state)``: o ``[B, 1, H, V]`` in v's dtype; the state buffer, holding the new state.
    """
    state = require_state_cache(initial_state)
    decode = importlib.import_module("flashinfer.gdn_decode").gated_delta_rule_decode
    A_log, a, dt_bias, b = flashinfer_gates(g, beta, v.dtype)
    # The gate's streamed halves are slices along T, strided when B > 1; FlashInfer keys its compiled kernels on
    # the inputs' unit-stride dims, so contiguous rows keep every call on the timed calls' kernel (a no-op for those).
    q, k, v = (x.contiguous() for x in (q, k, v))
    with torch.no_grad():
        o, _ = decode(q, k, v, state, A_log, a, dt_bias, b, scale=scale, use_qk_l2norm=False, backend="flashinfer")
    return o.to(v.dtype), state


def gdn_flashinfer_mtp(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """T > 1 new tokens through ``flashinfer.gdn_decode.gated_delta_rule_mtp`` (V-major state pool, written back).

    Shapes as :func:`gdn_flashinfer_decode` with T from 2 to 8. The state is copied into a V-major pool ``[B, H, V, K]``
    (row i of the batch is pool slot i), stepped there, and copied back into `initial_state`, which is returned.
    """
    state = require_state_cache(initial_state)
    mtp = importlib.import_module("flashinfer.gdn_decode").gated_delta_rule_mtp
    A_log, a, dt_bias, b = flashinfer_gates(g, beta, v.dtype)
    q, k, v = (x.contiguous() for x in (q, k, v))  # as in gdn_flashinfer_decode
    pool = state.transpose(-1, -2).contiguous()
    slots = torch.arange(q.shape[0], dtype=torch.int32, device=q.device)
    with torch.no_grad():
        o, _ = mtp(
            q, k, v, pool, slots, A_log, a, dt_bias, b,
            scale=scale, disable_state_update=False, use_qk_l2norm=False,
        )  # fmt: skip
        state.copy_(pool.transpose(-1, -2))
    return o.to(v.dtype), state


_DECODE = dict(
    backend="cuda",
    devices=("cuda",),
    dtypes=("bf16", "fp16"),
    requires=("flashinfer",),
    backward=False,
    modes=("decode",),
    state_in_place=True,
)
IMPLS = (
    ImplDecl(
        "gdn",
        "flashinfer_decode",
        f"{__name__}:gdn_flashinfer_decode",
        **_DECODE,
        constraint=_case_constraint("decode"),
        notes="FlashInfer 0.7.2.post1 gated_delta_rule_decode (CuTe DSL; T = 1, K-major state in place); "
        "g and beta passed as its pre-activations (a few elementwise kernels a call)",
    ),
    ImplDecl(
        "gdn",
        "flashinfer_mtp",
        f"{__name__}:gdn_flashinfer_mtp",
        **_DECODE,
        constraint=_case_constraint("mtp"),
        notes="FlashInfer 0.7.2.post1 gated_delta_rule_mtp (CuTe DSL; V-major state pool): the state transposed in "
        "and out by the adapter, and g and beta passed as its pre-activations, inside the call",
    ),
)
