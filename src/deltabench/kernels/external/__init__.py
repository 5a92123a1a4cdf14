"""Adapters that give third-party kernels deltabench's op signatures, so the same gate judges them.

Each module imports without its package installed (the package is imported on the first call) and holds plain
functions with an op's signature, ``fn(q, k, v, *gates, scale=None, initial_state=None) -> (o, final_state)``:

* :mod:`.fla`: flash-linear-attention 0.6.0's Triton path (``gdn_fla_chunk``, ``gdn_fla_recurrent``,
  ``gdn2_fla_chunk``, ``kda_fla_chunk``; token-serial and in-place decode steps for gdn2 and kda), with
  FlashQLA/TileLang dispatch off and FLA's #640 backward guard bypassed on Hopper (recorded in ``fla.run_notes()``);
* :mod:`.flash_qla`: FlashQLA's fused TileLang kernels (``gdn_flash_qla``; SM90+, bf16/fp16, K = V = 128);
* :mod:`.flashinfer`: FlashInfer 0.7.2.post1's GDN decode kernels (``gdn_flashinfer_decode``, ``gdn_flashinfer_mtp``;
  CuTe DSL, SM90+, mode decode);
* :mod:`.opengdn`: opengdn 0.1.0 (``gdn_opengdn_triton``, ``gdn_opengdn_chunkwise``);
* :mod:`.sdm`: sparse-delta-memory 2.0.0 (``sdm_package_chunk``, its decode step and product-key top-k; CUDA).

Each module declares its impls beside its code (``IMPLS``, kernels/declare.py) with ``requires=(package,)``, so
`deltabench list` shows each one as unavailable, with the reason, where its package is missing; this package's
``IMPLS`` gathers them for the registry. atomic-ops' adapter (:mod:`.atomic_ops`) imports JAX at its top, so its
declarations are here, where listing them imports no JAX.
"""

from typing import Any

from ..declare import JAX_DEVICES, JAX_DTYPES, ImplDecl
from . import fla, flash_qla, flashinfer, opengdn, sdm

__all__ = ["IMPLS", "fla", "flash_qla", "flashinfer", "opengdn", "sdm"]


def _atomic_ops_case(path: str) -> Any:
    def constraint(case: Any) -> str | None:
        from .atomic_ops import unsupported_reason

        return unsupported_reason(T=case.T, K=case.K, V=case.V, device=case.device, path=path)

    return constraint


# atomic-ops 0.2.0 (atomic_ops.py): JAX, so timed natively like deltabench's JAX impls.
_ATOMIC_OPS = tuple(
    ImplDecl(
        "gdn2",
        name,
        f"{__name__}.atomic_ops:{name}",
        backend="jax",
        devices=devices,
        dtypes=JAX_DTYPES,
        constraint=_atomic_ops_case(path),
        requires=("atomic_ops", "jax"),
        notes=note,
    )
    for name, path, devices, note in (
        ("atomic_ops_fused", "fused", ("tpu",), "atomic-ops 0.2.0 gdn2_pallas_forward_trainable: fused Pallas fwd+bwd"),
        (
            "atomic_ops_auto",
            "auto",
            JAX_DEVICES,
            "atomic-ops 0.2.0 gdn2_forward_trainable: its fused kernel on a TPU with K=128, its chunked WY elsewhere",
        ),
        ("atomic_ops_wy", "wy", JAX_DEVICES, "atomic-ops 0.2.0 gdn2_chunked_wy_reference (pure JAX, chunk 256)"),
        ("atomic_ops_serial", "serial", JAX_DEVICES, "atomic-ops 0.2.0 gdn2_token_serial_reference (pure JAX scan)"),
    )
)
IMPLS = (*fla.IMPLS, *flash_qla.IMPLS, *flashinfer.IMPLS, *opengdn.IMPLS, *sdm.IMPLS, *_ATOMIC_OPS)
