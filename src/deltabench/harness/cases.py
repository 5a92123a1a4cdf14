"""Cases: one op at one shape, dtype, seed, gate regime and mode; and the parsing of user input into them."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from deltabench.references.contract import INDEXED_DIMS, REGIMES, parse_dims, shape_id

from .devices import parse_device, parse_platform
from .errors import BadInput
from .seqlens import prefix_seqlens, seqlens_problem

__all__ = [
    "DECODE_MAX_T",
    "DTYPES",
    "MAX_SEED",
    "MODES",
    "REGIMES",
    "Case",
    "dtype_name",
    "has_backward",
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
# ``decode``: a forward of T = 1..DECODE_MAX_T new tokens from a given state (a serving step: one token, or a few
# speculative or multi-token-prediction ones), returning the outputs and the new state; no backward.
MODES = ("fwd", "fwd+bwd", "bwd", "decode")
DECODE_MAX_T = 8
# The largest first seed of a case: its gate adds the seed's index and fixed offsets (cotangents) to it, which must
# stay within torch's 64-bit generator seeds.
MAX_SEED = 2**62 - 1


def has_backward(mode: str) -> bool:
    """Whether `mode` back-propagates (``fwd+bwd`` and ``bwd``; ``fwd`` and ``decode`` are forward only)."""
    return mode in ("fwd+bwd", "bwd")


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


def _contract(op: str | None) -> Any:
    """The contract of `op` (the delta family's, gdn's, when None), or None for an op not registered here."""
    from .errors import UnknownOp
    from .ops import get_op

    try:
        return get_op(op or "gdn")
    except UnknownOp:
        return None


def parse_shape(text: str, op: str | None = None) -> dict[str, int]:
    """Parse ``B=2,T=200,H=4,K=64,V=64`` (or ``B2-T200-...``) into the dims of `op` (default: the delta family's
    B, T, H, K, V, where V defaults to K); every dim must be given (or defaulted) and a positive int."""
    try:
        given = parse_dims(text)
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    contract = _contract(op)
    if contract is None:
        raise BadInput(f"unknown op {op!r}: cannot read its shape {text!r}")
    names = contract.dims
    example = ",".join(f"{d}={v}" for d, v in zip(names, (2, 200, 4, 64, 64, 8, 8), strict=False))
    unknown = [d for d in given if d not in names]
    if unknown:
        raise BadInput(f"unknown dimension {unknown[0]!r} in shape {text!r}: dimensions are {', '.join(names)}")
    for dim, source in contract.dim_defaults:
        if dim not in given and source in given:
            given[dim] = given[source]
    missing = [d for d in names if d not in given]
    if missing:
        raise BadInput(f"shape {text!r} lacks {', '.join(missing)}: expected e.g. {example}")
    bad = [d for d in names if given[d] < 1]
    if bad:
        raise BadInput(f"shape {text!r}: {', '.join(bad)} must be at least 1")
    problem = contract.dims_problem(given)
    if problem:
        raise BadInput(f"shape {text!r}: {problem}")
    return {d: given[d] for d in names}


def _check_decode(op: str, contract: Any, dims: dict[str, int]) -> None:
    """BadInput unless `op` has a decode mode (its contract's ``decode``) and T is 1..DECODE_MAX_T new tokens."""
    if contract is None or not getattr(contract, "decode", False):
        raise BadInput(f"op {op!r} has no decode mode")
    if dims.get("T", 1) > DECODE_MAX_T:
        raise BadInput(f"mode decode takes T from 1 to {DECODE_MAX_T} new tokens, got T={dims['T']}")


_CASE_FIELDS = ("dtype", "seed", "regime", "initial_state", "mode", "device")
_PACKED_FIELDS = ("seqlens", "seqlens_from")  # in a case's dict only when it packs sequences


@dataclasses.dataclass(frozen=True, init=False)
class Case:
    """One problem instance: an op at a shape (its contract's named dims), dtype, seed, regime, mode and device.

    Dims are given by name (``Case("gdn", B=1, T=64, H=2, K=16, V=16)``, V defaulting to K as the contract says) or
    positionally in the contract's order (``Case("gdn", 1, 64, 2, 16, 16)``) and read as attributes
    (``case.T``) or as :attr:`dims`. An op not registered here keeps the dims it is given, as given.

    `seqlens` packs sequences of those lengths along T (B = 1, FLA's ``cu_seqlens``; harness/seqlens.py): the state
    then has one row per sequence (:attr:`state_dims`). `seqlens_from` names the distribution they were drawn from.
    """

    op: str
    shape: tuple[tuple[str, int], ...]
    dtype: str = "fp32"
    seed: int = 0
    regime: str = "typical"
    initial_state: bool = False
    mode: str = "fwd"
    device: str = "cpu"
    seqlens: tuple[int, ...] | None = None
    seqlens_from: str = ""

    def __init__(
        self,
        op: str,
        *positional: int,
        dtype: str = "fp32",
        seed: int = 0,
        regime: str = "typical",
        initial_state: bool = False,
        mode: str = "fwd",
        device: str = "cpu",
        shape: Any = None,
        seqlens: Any = None,
        seqlens_from: str = "",
        **named: int,
    ) -> None:
        contract = _contract(op)
        given = dict(shape or {})
        order = contract.dims if contract is not None else INDEXED_DIMS
        if len(positional) > len(order):
            raise BadInput(f"op {op!r} has {len(order)} dims ({', '.join(order)}), got {len(positional)} sizes")
        given.update(zip(order, positional, strict=False))
        given.update(named)
        if contract is not None:
            try:
                given = contract.complete_dims(given)
            except ValueError as exc:
                raise BadInput(str(exc)) from None
            regimes = contract.regimes
        else:
            regimes = REGIMES
        for d, size in given.items():
            if int(size) < 1:
                raise BadInput(f"{d} must be at least 1, got {size}")
        problem = contract.dims_problem(given) if contract is not None else None
        if problem:
            raise BadInput(f"op {op!r}: {problem}")
        if regime not in regimes:
            raise BadInput(f"unknown gate regime {regime!r}: use one of {', '.join(regimes)}")
        if mode not in MODES:
            raise BadInput(f"unknown mode {mode!r}: use one of {', '.join(MODES)}")
        if mode == "decode":
            _check_decode(op, contract, given)
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
            raise BadInput(f"seed {seed!r} is out of range: use an integer from 0 to {MAX_SEED} (2**62 - 1)")
        if seqlens is not None:
            seqlens = tuple(int(n) for n in seqlens)
            if contract is not None and not contract.varlen:
                raise BadInput(f"op {op!r} does not take packed sequences (seqlens)")
            if mode == "decode":
                raise BadInput("mode decode steps a batch of states: it takes no packed sequences (seqlens)")
            problem = seqlens_problem(seqlens, int(given.get("T", 0)), int(given.get("B", 0)))
            if problem:
                raise BadInput(f"op {op!r}: {problem}")
        set_ = object.__setattr__
        set_(self, "op", op)
        set_(self, "shape", tuple((d, int(v)) for d, v in given.items()))
        set_(self, "dtype", parse_dtype(dtype))
        set_(self, "seed", seed)
        set_(self, "regime", regime)
        set_(self, "initial_state", initial_state)
        set_(self, "mode", mode)
        # a platform only: the runners compare it as such; a GPU is chosen with CUDA_VISIBLE_DEVICES
        set_(self, "device", parse_platform(device))
        set_(self, "seqlens", seqlens)
        set_(self, "seqlens_from", str(seqlens_from) if seqlens is not None else "")

    def __getattr__(self, name: str) -> int:
        # Only called when normal lookup fails: a dim of the case's shape (``case.T``).
        if name != "shape" and not name.startswith("_"):
            for d, size in self.__dict__.get("shape", ()):
                if d == name:
                    return size
        raise AttributeError(f"{type(self).__name__} of op {self.__dict__.get('op')!r} has no dim or field {name!r}")

    @property
    def torch_device(self) -> str:
        """Where torch builds this case's tensors: the GPU for ``cuda``, else the host (a ``tpu`` case's JAX
        impl receives them on the TPU, see harness.devices.placement)."""
        return parse_device(self.device).torch_device

    @property
    def dims(self) -> dict[str, int]:
        """The shape as ``{dim: size}`` in the contract's order (``{"B":..., "T":..., "H":..., "K":..., "V":...}``)."""
        return dict(self.shape)

    @property
    def state_dims(self) -> dict[str, int]:
        """The dims the state is laid out over: :attr:`dims`, but one state row per packed sequence (B = N)."""
        return self.dims if self.seqlens is None else {**self.dims, "B": len(self.seqlens)}

    @property
    def shape_id(self) -> str:
        """A readable id such as ``B2-T200-H4-K64-V64`` (references/contract.shape_id: the one spelling); packed
        sequences add their count and, when drawn, their distribution (``B1-T300-H2-K32-V32-N4``)."""
        return shape_id(self.dims, self.seqlens, self.seqlens_from)

    @property
    def torch_dtype(self) -> torch.dtype:
        """The torch dtype of the case."""
        return DTYPES[self.dtype]

    def replace(self, **changes: Any) -> Case:
        """A copy with some fields or dims changed (``case.replace(T=64, regime="long")``). A packed case cut to a
        shorter T keeps the sequences of its first T tokens (harness/seqlens.prefix_seqlens)."""
        if self.seqlens is not None and "seqlens" not in changes and changes.get("T", self.T) != self.T:
            changes["seqlens"] = prefix_seqlens(self.seqlens, changes["T"])
        fields = {f: changes.pop(f, getattr(self, f)) for f in (*_CASE_FIELDS, *_PACKED_FIELDS)}
        return Case(self.op, **{**self.dims, **changes}, **fields)

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form (for JSON and result documents): op, each dim by name, then the other fields (the packed
        lengths and their distribution only where the case packs sequences)."""
        packed = {} if self.seqlens is None else {"seqlens": list(self.seqlens), "seqlens_from": self.seqlens_from}
        return {"op": self.op, **self.dims, **{f: getattr(self, f) for f in _CASE_FIELDS}, **packed}

    def __str__(self) -> str:
        init = "+h0" if self.initial_state else ""
        return f"{self.op} {self.shape_id} {self.dtype} {self.regime}{init} seed={self.seed} {self.mode}"
