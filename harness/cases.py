"""Cases: one op at one shape, dtype, seed, gate regime and mode; and the parsing of user input into them."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import torch
from deltabench.references._inputs import REGIMES  # the gate regimes, defined with the input generators

from .devices import parse_device, parse_platform
from .errors import BadInput

__all__ = [
    "DTYPES",
    "MODES",
    "REGIMES",
    "Case",
    "dtype_name",
    "parse_dtype",
    "parse_shape",
    "torch_dtype",
]

# Canonical short names and the aliases a user may type.
DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
_DTYPE_ALIASES = {
    "fp32": "fp32",
    "float32": "fp32",
    "float": "fp32",
    "f32": "fp32",
    "torch.float32": "fp32",
    "bf16": "bf16",
    "bfloat16": "bf16",
    "torch.bfloat16": "bf16",
    "fp16": "fp16",
    "float16": "fp16",
    "half": "fp16",
    "f16": "fp16",
    "torch.float16": "fp16",
}
MODES = ("fwd", "fwd+bwd", "bwd")
_DIMS = ("B", "T", "H", "K", "V")


def parse_dtype(text: str) -> str:
    """Return the canonical dtype name (``fp32``, ``bf16``, ``fp16``) for `text`, or raise BadInput."""
    name = _DTYPE_ALIASES.get(str(text).strip().lower())
    if name is None:
        raise BadInput(f"unsupported dtype {text!r}: use one of fp32, bf16, fp16 (or float32, bfloat16, float16)")
    return name


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a canonical or aliased dtype name."""
    return DTYPES[parse_dtype(name)]


def dtype_name(dtype: torch.dtype) -> str:
    """The canonical short name of a torch dtype."""
    for name, dt in DTYPES.items():
        if dt == dtype:
            return name
    raise BadInput(f"unsupported dtype {dtype}")


def parse_shape(text: str) -> dict[str, int]:
    """Parse ``B=2,T=200,H=4,K=64,V=64`` into a dict; V defaults to K, and every dim must be a positive int."""
    dims: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in str(text).split(","))):
        m = re.fullmatch(r"([A-Za-z]+)\s*=\s*(\d+)", part)
        if not m:
            raise BadInput(f"malformed shape {text!r}: expected e.g. B=2,T=200,H=4,K=64,V=64")
        key = m.group(1).upper()
        if key not in _DIMS:
            raise BadInput(f"unknown dimension {m.group(1)!r} in shape {text!r}: dimensions are {', '.join(_DIMS)}")
        if key in dims:
            raise BadInput(f"dimension {key} given twice in shape {text!r}")
        dims[key] = int(m.group(2))
    if "V" not in dims and "K" in dims:
        dims["V"] = dims["K"]
    missing = [d for d in _DIMS if d not in dims]
    if missing:
        raise BadInput(f"shape {text!r} lacks {', '.join(missing)}: expected e.g. B=2,T=200,H=4,K=64,V=64")
    bad = [d for d in _DIMS if dims[d] < 1]
    if bad:
        raise BadInput(f"shape {text!r}: {', '.join(bad)} must be at least 1")
    return {d: dims[d] for d in _DIMS}


@dataclasses.dataclass(frozen=True)
class Case:
    """One problem instance: an op at a shape, dtype, seed, gate regime, mode and device."""

    op: str
    B: int
    T: int
    H: int
    K: int
    V: int
    dtype: str = "fp32"
    seed: int = 0
    regime: str = "typical"
    initial_state: bool = False
    mode: str = "fwd"
    device: str = "cpu"

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", parse_dtype(self.dtype))
        if self.regime not in REGIMES:
            raise BadInput(f"unknown gate regime {self.regime!r}: use one of {', '.join(REGIMES)}")
        if self.mode not in MODES:
            raise BadInput(f"unknown mode {self.mode!r}: use one of {', '.join(MODES)}")
        # a platform only: the runners compare it as such; a GPU is chosen with CUDA_VISIBLE_DEVICES
        object.__setattr__(self, "device", parse_platform(self.device))
        for d in _DIMS:
            if int(getattr(self, d)) < 1:
                raise BadInput(f"{d} must be at least 1, got {getattr(self, d)}")

    @property
    def torch_device(self) -> str:
        """Where torch builds this case's tensors: the GPU for ``cuda``, else the host (a ``tpu`` case's JAX
        impl receives them on the TPU, see harness.devices.placement)."""
        return parse_device(self.device).torch_device

    @property
    def dims(self) -> dict[str, int]:
        """``{"B":..., "T":..., "H":..., "K":..., "V":...}``."""
        return {d: getattr(self, d) for d in _DIMS}

    @property
    def shape_id(self) -> str:
        """A readable id such as ``B2-T200-H4-K64-V64``."""
        return "-".join(f"{d}{getattr(self, d)}" for d in _DIMS)

    @property
    def torch_dtype(self) -> torch.dtype:
        """The torch dtype of the case."""
        return DTYPES[self.dtype]

    def replace(self, **changes: Any) -> Case:
        """A copy with some fields changed."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form (for JSON and result documents)."""
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        init = "+h0" if self.initial_state else ""
        return f"{self.op} {self.shape_id} {self.dtype} {self.regime}{init} seed={self.seed} {self.mode}"
