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


# What the three gdn Triton impls share (CPU through the Triton interpreter); each row adds its own keywords.
_TRITON = dict(
    backend="triton", devices=("cuda", "cpu"), dtypes=ALL_DTYPES, constraint=_triton_dims, requires=("triton",)
)
for _name, _target, _own in (
    ("triton_chunk", "chunk:gdn_triton_chunk", {}),
    (
        "triton_chunk_split",
        "chunk_split:gdn_triton_chunk_split",
        {"notes": "split forward (state walk + parallel output); H200 times in benchmarks/NOTES.md"},
    ),
    ("triton_recurrent", "fused_recurrent:gdn_triton_recurrent", {"supports_backward": False}),
):
    register_impl("gdn", _name, **_TRITON, **_own)(lazy(f"deltabench.kernels.gdn.{_target}"))

# --- JAX subjects (kernels/<op>/jax_*.py) --------------------------------------------------------------------------
# Torch-facing wrappers (the gate checks the JAX forward and vjp); runners.jax times their `.jax_fn` natively.
JAX_DEVICES = ("cpu", "cuda", "tpu")
JAX_DTYPES = ("fp32", "bf16")
# The associative scan holds a [K, K] matrix per token (and XLA keeps a few copies of them): cap it by device.
_SCAN_MATRIX_CAP_GIB = {"cpu": 1.0, "cuda": 16.0, "tpu": 4.0}


def _jax_scan_memory(case: Case) -> str | None:
    """Refuse shapes whose per-token transition matrices would not fit the device comfortably."""
    gib = case.B * case.T * case.H * case.K * case.K * 4 / 2**30
    cap = _SCAN_MATRIX_CAP_GIB.get(case.device, 1.0)
    if gib > cap:
        return f"the associative scan's per-token [K, K] matrices take {gib:.1f} GiB, over {cap:g} GiB on {case.device}"
    return None


for _op in ("gdn", "gdn2"):
    register_impl(_op, "jax_chunk", backend="jax", devices=JAX_DEVICES, dtypes=JAX_DTYPES, requires=("jax",))(
        lazy(f"deltabench.kernels.{_op}.jax_chunk:{_op}_jax_chunk")
    )
    register_impl(
        _op,
        "jax_scan",
        backend="jax",
        devices=JAX_DEVICES,
        dtypes=JAX_DTYPES,
        constraint=_jax_scan_memory,
        requires=("jax",),
        notes="associative-scan baseline: O(T K^2) memory",
    )(lazy(f"deltabench.kernels.{_op}.jax_scan:{_op}_jax_scan"))

# --- Pallas kernels (kernels/gdn2/pallas/): Mosaic on a TPU, Pallas' interpreter on the CPU ----------------------
# The interpreter runs each (batch, head, chunk) program as XLA operations, one after another: for checking only.
_PALLAS_CPU_PROGRAMS = 256


def _pallas_case(case: Case) -> str | None:
    """Why the fused Pallas GDN-2 kernel cannot run `case` (None when it can)."""
    if case.device == "tpu" and (case.K % 128 or case.V % 128):
        return f"Mosaic blocks of [64, K] and [64, V] need K and V multiples of 128 (got K={case.K}, V={case.V})"
    programs = case.B * case.H * -(-case.T // 64)
    if case.device == "cpu" and programs > _PALLAS_CPU_PROGRAMS:
        return (
            f"on the CPU the kernel runs in Pallas' interpreter, for checking: up to {_PALLAS_CPU_PROGRAMS} "
            f"(batch, head, chunk) programs, this case has {programs}"
        )
    return None


for _op in ("gdn2", "kda"):
    register_impl(
        _op,
        "pallas_chunk",
        backend="jax",
        devices=("cpu", "tpu"),
        dtypes=JAX_DTYPES,
        constraint=_pallas_case,
        requires=("jax",),
        notes="fused Pallas forward and backward kernels (Mosaic on a TPU; the interpreter on the CPU)",
    )(lazy(f"deltabench.kernels.gdn2.pallas.chunk:{_op}_pallas_chunk"))

# --- External adapters (kernels/external/) --------------------------------------------------------------------------
# (section owned by the adapters work; each registered with requires=(its package,))
_FLA = "deltabench.kernels.external.fla"
_FLA_NOTE = "FLA 0.6.0's Triton path: FlashQLA and TileLang dispatch off (FLA_FLASH_QLA=0, FLA_TILELANG=0)"


def _fla_dims(case: Case) -> str | None:
    # FLA's chunk kernels hold a whole key row in one tile: chunk_gdn2/chunk_kda assert K <= 256.
    if case.K > 256 or case.V > 256:
        return f"K and V up to 256 in FLA (got K={case.K}, V={case.V})"
    return None


def _flash_qla_case(case: Case) -> str | None:
    from deltabench.kernels.external.flash_qla import unsupported_reason

    capability = None
    if case.device == "cuda":
        import torch

        if torch.cuda.is_available():
            capability = torch.cuda.get_device_capability()
    return unsupported_reason(K=case.K, V=case.V, device=case.device, capability=capability)


def _opengdn_triton_dims(case: Case) -> str | None:
    if case.K > 512 or case.V > 512:
        return f"K and V up to 512 in opengdn's Triton path (got K={case.K}, V={case.V})"
    return None


# What every FLA impl shares; each registration adds its own notes (and fla_recurrent its missing backward).
_FLA_IMPL = dict(backend="triton", devices=("cuda",), dtypes=ALL_DTYPES, constraint=_fla_dims, requires=("fla",))
register_impl(
    "gdn",
    "fla_chunk",
    **_FLA_IMPL,
    notes=f"{_FLA_NOTE}; bwd guard bypassed (FLA #640) on Hopper with Triton >=3.4,<3.7.1: the gate judges it",
)(lazy(f"{_FLA}:gdn_fla_chunk"))
register_impl(
    "gdn",
    "fla_recurrent",
    **_FLA_IMPL,
    supports_backward=False,
    notes="FLA 0.6.0's fused_recurrent_gated_delta_rule (it has no backward)",
)(lazy(f"{_FLA}:gdn_fla_recurrent"))
for _op in ("gdn2", "kda"):
    register_impl(_op, "fla_chunk", **_FLA_IMPL, notes=_FLA_NOTE)(lazy(f"{_FLA}:{_op}_fla_chunk"))
register_impl(
    "gdn",
    "flash_qla",
    backend="cuda",
    devices=("cuda",),
    dtypes=("bf16", "fp16"),
    constraint=_flash_qla_case,
    requires=("flash_qla", "tilelang"),
    notes="FlashQLA 0.1.3 (TileLang); compiles each new shape on its first call, tens of seconds",
)(lazy("deltabench.kernels.external.flash_qla:gdn_flash_qla"))
register_impl(
    "gdn",
    "opengdn_triton",
    backend="triton",
    devices=("cuda",),
    dtypes=("bf16",),
    constraint=_opengdn_triton_dims,
    requires=("opengdn", "triton"),
    notes="opengdn 0.1.0 gated_delta_triton; raises instead of falling back to its chunkwise path",
)(lazy("deltabench.kernels.external.opengdn:gdn_opengdn_triton"))
register_impl(
    "gdn",
    "opengdn_chunkwise",
    backend="torch",
    devices=("cpu", "cuda"),
    dtypes=ALL_DTYPES,
    requires=("opengdn",),
    notes="opengdn 0.1.0 gated_delta_chunkwise (PyTorch extended WY, chunk 64)",
)(lazy("deltabench.kernels.external.opengdn:gdn_opengdn_chunkwise"))


# atomic-ops 0.2.0 (kernels/external/atomic_ops.py): JAX, so timed natively like deltabench's JAX impls.
_ATOMIC = "deltabench.kernels.external.atomic_ops"


def _atomic_ops_case(path: str):
    def constraint(case: Case) -> str | None:
        from deltabench.kernels.external.atomic_ops import unsupported_reason

        return unsupported_reason(T=case.T, K=case.K, V=case.V, device=case.device, path=path)

    return constraint


for _name, _path, _devices, _note in (
    ("atomic_ops_fused", "fused", ("tpu",), "atomic-ops 0.2.0 gdn2_pallas_forward_trainable: fused Pallas fwd+bwd"),
    (
        "atomic_ops_auto",
        "auto",
        JAX_DEVICES,
        "atomic-ops 0.2.0 gdn2_forward_trainable: its fused kernel on a TPU with K=128, its chunked WY elsewhere",
    ),
    ("atomic_ops_wy", "wy", JAX_DEVICES, "atomic-ops 0.2.0 gdn2_chunked_wy_reference (pure JAX, chunk 256)"),
    ("atomic_ops_serial", "serial", JAX_DEVICES, "atomic-ops 0.2.0 gdn2_token_serial_reference (pure JAX scan)"),
):
    register_impl(
        "gdn2",
        _name,
        backend="jax",
        devices=_devices,
        dtypes=JAX_DTYPES,
        constraint=_atomic_ops_case(_path),
        requires=("atomic_ops", "jax"),
        notes=_note,
    )(lazy(f"{_ATOMIC}:{_name}"))
