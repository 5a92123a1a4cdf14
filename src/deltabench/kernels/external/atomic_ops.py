"""Adapters for atomic-ops 0.2.0 (PyPI ``atomic-ops``, import ``atomic_ops``): fused GDN-2 kernels for TPU v5e in
JAX/Pallas, and its pure-JAX references.

Four of its functions, each mapped to deltabench's gdn2 contract ``fn(q, k, v, g, b, w, scale=None,
initial_state=None) -> (o, final_state)``:

* ``gdn2_pallas_forward_trainable(q, k, v, w, b, g, scale, h0)``: its fused Pallas forward and backward (a
  ``custom_vjp``); Mosaic, so a TPU only, with ``d = 128`` (it checks K = 128 and every input shaped like q, so V =
  128 too);
* ``gdn2_forward_trainable(q, k, v, w, b, g, scale, h0)``: its dispatcher. It runs the fused kernel where
  ``atomic_ops.is_tpu_available()`` and K = 128, else its chunked WY reference: :func:`dispatched_path` says which,
  so that a table never labels the fallback as the fused kernel;
* ``gdn2_chunked_wy_reference(q, k, v, g, b, w, scale, chunk_size, h0)``: pure JAX, chunked WY, autodiff backward;
* ``gdn2_token_serial_reference(q, k, v, g, b, w, scale, h0)``: pure JAX, one token at a time (``lax.scan``).

Note the two argument orders: the fused entry points take ``(w, b, g)``, the references ``(g, b, w)``. Its
semantics are deltabench's gdn2 (per-channel log-decay g, erase b over K, write w over V; state ``[B, H, K, V]``);
every path clips its state to +-1e4, its chunked paths clamp pairwise log-decays to [-20, 20], and its fused
kernel's default configuration damps the WY system by ``wy_eps = 1e-3`` (its references solve it exactly): the
gate judges each like anything else. Its chunked paths need ``T % bt == 0`` with ``bt = 256`` (``DEFAULT_CONFIG``); the
reference's o comes back float32 and is cast to v's dtype here.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ..common.jax.jax_bridge import TorchFacingJaxOp

__all__ = [
    "BT",
    "atomic_ops_auto",
    "atomic_ops_fused",
    "atomic_ops_serial",
    "atomic_ops_wy",
    "dispatched_path",
    "unsupported_reason",
]

BT = 256  # atomic_ops.DEFAULT_CONFIG.bt: the chunk of its fused kernel and of the dispatcher's WY fallback


def _tpu_available() -> bool:
    import atomic_ops

    return bool(atomic_ops.is_tpu_available())


def dispatched_path(K: int) -> str:
    """Which kernel ``gdn2_forward_trainable`` runs here for head dim `K`: ``"fused_pallas"`` or ``"chunked_wy"``."""
    return "fused_pallas" if _tpu_available() and K == 128 else "chunked_wy"


def unsupported_reason(*, T: int, K: int, V: int, device: str, path: str) -> str | None:
    """Why atomic-ops' `path` (``fused``, ``auto``, ``wy`` or ``serial``) cannot run this case, or None."""
    if path in ("fused", "auto", "wy") and T % BT:
        return f"atomic-ops' chunked paths need T a multiple of bt={BT} (seq_len % bt == 0), got T={T}"
    fused = path == "fused" or (path == "auto" and device == "tpu" and K == 128)
    if fused:
        if device != "tpu":
            return "atomic-ops' fused kernel is Mosaic (Pallas TPU) code: it runs on a TPU only"
        if K != 128 or V != 128:
            return f"atomic-ops' fused kernel needs d = 128 (K = V = 128), got K={K}, V={V}"
        if not _tpu_available():
            return "no TPU visible to JAX here (atomic_ops.is_tpu_available() is False)"
    return None


def _defaults(q: jax.Array, v: jax.Array, scale: float | None, initial_state: jax.Array | None):
    B, _, H, K = q.shape
    scale = K**-0.5 if scale is None else float(scale)
    h0 = jnp.zeros((B, H, K, v.shape[-1]), jnp.float32) if initial_state is None else initial_state
    return scale, h0.astype(jnp.float32)


def _finish(o: jax.Array, state: jax.Array, v: jax.Array) -> tuple[jax.Array, jax.Array]:
    return o.astype(v.dtype), state.astype(jnp.float32)


def gdn2_atomic_fused(q, k, v, g, b, w, scale=None, initial_state=None):
    """atomic-ops' fused Pallas GDN-2 (``gdn2_pallas_forward_trainable``; TPU, K = V = 128, T % 256 == 0)."""
    import atomic_ops

    scale, h0 = _defaults(q, v, scale, initial_state)
    return _finish(*atomic_ops.gdn2_pallas_forward_trainable(q, k, v, w, b, g, scale, h0=h0), v)


def gdn2_atomic_auto(q, k, v, g, b, w, scale=None, initial_state=None):
    """atomic-ops' dispatcher ``gdn2_forward_trainable`` (fused on a TPU with K = 128, else its chunked WY)."""
    import atomic_ops

    scale, h0 = _defaults(q, v, scale, initial_state)
    return _finish(*atomic_ops.gdn2_forward_trainable(q, k, v, w, b, g, scale, h0=h0), v)


def gdn2_atomic_wy(q, k, v, g, b, w, scale=None, initial_state=None):
    """atomic-ops' pure-JAX chunked WY reference, chunk 256 (``gdn2_chunked_wy_reference``; T % 256 == 0)."""
    import atomic_ops

    scale, h0 = _defaults(q, v, scale, initial_state)
    return _finish(*atomic_ops.gdn2_chunked_wy_reference(q, k, v, g, b, w, scale, BT, h0=h0), v)


def gdn2_atomic_serial(q, k, v, g, b, w, scale=None, initial_state=None):
    """atomic-ops' token-serial reference (``gdn2_token_serial_reference``; any T)."""
    import atomic_ops

    scale, h0 = _defaults(q, v, scale, initial_state)
    return _finish(*atomic_ops.gdn2_token_serial_reference(q, k, v, g, b, w, scale, h0=h0), v)


_GATES = ("g", "b", "w")
atomic_ops_fused = TorchFacingJaxOp(gdn2_atomic_fused, name="gdn2/atomic_ops_fused", gates=_GATES)
atomic_ops_auto = TorchFacingJaxOp(gdn2_atomic_auto, name="gdn2/atomic_ops_auto", gates=_GATES)
atomic_ops_wy = TorchFacingJaxOp(gdn2_atomic_wy, name="gdn2/atomic_ops_wy", gates=_GATES)
atomic_ops_serial = TorchFacingJaxOp(gdn2_atomic_serial, name="gdn2/atomic_ops_serial", gates=_GATES)
