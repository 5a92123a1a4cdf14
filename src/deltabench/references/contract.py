"""An op's contract as plain data: its named dims, its inputs, output and state, its oracle, input generator, work
model and the checks that apply to it.

Every op is called ``fn(*inputs, [scale=...,] <state>=None) -> (output, final_state)``: the inputs in the
contract's order, the optional initial state by keyword. Layouts are tuples of dim names; the first dim of every
tensor is the batch dim ``B`` (the oracle stacks runs along it) and a sequence tensor has the time dim ``T`` second
(the streaming check splits along it). Nothing here imports the rest of deltabench (nor torch), so a user's file can
declare an op without the harness.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = [
    "CU_SEQLENS",
    "DECODE_PREFIX",
    "DTYPE_RULES",
    "INDEXED_DIMS",
    "REGIMES",
    "ArgSpec",
    "OpContract",
    "Training",
    "chunked_delta_work",
    "decode_work",
    "delta_contract",
    "fwd_bwd_work",
    "io_bytes",
    "order_dims",
    "parse_dims",
    "shape_id",
    "streaming_work",
]

# The gate regimes every generator here draws (references/_inputs.py documents them).
REGIMES = ("typical", "long", "strong")
# The dims a result store keeps in columns of their own (indexed); an op's other dims are stored beside them.
INDEXED_DIMS = ("B", "T", "H", "K", "V")
# "float": the case's dtype; "float32": float32 whatever the case's dtype (a log-decay, a state); "index": int64.
DTYPE_RULES = ("float", "float32", "index")
_ELEM_BYTES = {"float32": 4, "index": 8}
# The prefix a decode case's state is drawn after: the op's own recurrence over this many seeded tokens (the
# case's regime, from a random state), so that the state has the magnitude and structure a served sequence leaves.
DECODE_PREFIX = 64
# The keyword of packed variable-length batches (FLA's convention): int32 [N + 1] offsets of N sequences packed along
# T of a batch of one; the initial and final states then hold one row per sequence, [N, ...] in place of [B, ...].
CU_SEQLENS = "cu_seqlens"
_DIM_NAME = re.compile(r"[A-Z]+")  # letters only: a shape id such as B2-T200 then reads back one way


@dataclasses.dataclass(frozen=True)
class ArgSpec:
    """One tensor of an op: its name, its layout over the op's dims, its dtype rule and whether it has a gradient.

    `layout` may be given as a string of one-letter dims (``"BTHK"``); it is kept as a tuple of dim names.
    `extent`, where given, is the tensor's shape as a function of the dims, for a tensor whose extents are not
    dims themselves (a conv kernel's width, several tensors packed into one): `layout` then names the dims it
    depends on, the batch dim first.
    """

    name: str
    layout: tuple[str, ...]
    dtype: str = "float"
    differentiable: bool = True
    optional: bool = False
    extent: Callable[[Mapping[str, int]], tuple[int, ...]] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.layout, str):
            object.__setattr__(self, "layout", tuple(self.layout))
        if self.dtype not in DTYPE_RULES:
            raise ValueError(f"{self.name}: dtype rule {self.dtype!r} is not one of {', '.join(DTYPE_RULES)}")
        if self.dtype == "index" and self.differentiable:
            raise ValueError(f"{self.name}: an index tensor has no gradient (differentiable=False)")

    def shape(self, dims: Mapping[str, int]) -> tuple[int, ...]:
        """The tensor's shape at `dims`."""
        if self.extent is not None:
            return tuple(int(n) for n in self.extent(dims))
        return tuple(int(dims[d]) for d in self.layout)

    def numel(self, dims: Mapping[str, int]) -> int:
        """How many elements the tensor holds at `dims`."""
        return math.prod(self.shape(dims))

    def elem_bytes(self, case_elem_bytes: int) -> int:
        """Bytes per element when the case's float dtype takes `case_elem_bytes`."""
        return _ELEM_BYTES.get(self.dtype, case_elem_bytes)

    @property
    def sequence(self) -> bool:
        """True when the tensor runs along time (``T`` its second dim): the streaming check splits it."""
        return self.extent is None and len(self.layout) > 1 and self.layout[1] == "T"


@dataclasses.dataclass(frozen=True)
class Training:
    """How an op that is a model's per-token loss is trained (``lm_step``): its optimizer step and the check that
    training works.

    Attributes:
        optimizer: ``optimizer(params) -> torch.optim.Optimizer`` over the op's differentiable inputs (leaves).
        step: ``step(fn, args, optimizer, **kwargs) -> loss``: one training step of impl `fn` on its positional
            `args` (the op's inputs, the parameters among them the optimizer's leaves): the forward, the mean of
            its per-token output as the loss, the backward and the optimizer's step; returns the loss (detached).
            A timed ``fwd+bwd`` job of the op times this whole step.
        memorise: ``memorise(fn, dims, dtype=, device=, seed=) -> (losses, bound)``: the losses of a few steps of
            `fn` on one fixed batch, and the bound the last must be under (the ``loss falls`` gate record).
        wrap_mixer: ``wrap_mixer(wrap)``, a context manager within which the op's built-in forward calls each of its
            sequence mixers through ``wrap(mixer)`` (for the mixer's share of a step; an impl that does not go
            through the op's own forward is not seen).
    """

    optimizer: Callable[[list[Any]], Any]
    step: Callable[..., Any]
    memorise: Callable[..., tuple[list[float], float]]
    wrap_mixer: Callable[[Callable[..., Any]], Any]


# A work model: (contract, dims, bytes of the case's float dtype, mode) -> {"flops": ..., "bytes": ...}.
WorkModel = Callable[["OpContract", Mapping[str, int], int, str], dict[str, float]]


def io_bytes(contract: OpContract, dims: Mapping[str, int], elem: int) -> tuple[int, int, int]:
    """The floor of one forward call's traffic: (every input read once, the output written once, the state once)."""
    inputs = sum(a.numel(dims) * a.elem_bytes(elem) for a in contract.inputs)
    out = contract.output.numel(dims) * contract.output.elem_bytes(elem)
    state = contract.state.numel(dims) * contract.state.elem_bytes(elem)
    return inputs, out, state


# The chunk length the chunked-delta work model assumes (the chunked pipelines' C).
CHUNK = 64


def chunked_delta_work(contract: OpContract, dims: Mapping[str, int], elem: int, mode: str) -> dict[str, float]:
    """FLOP and minimum-byte counts of one call, as a chunked delta-rule pipeline computes it.

    Forward FLOP per token per head: ``5*C*(K+V) + 6*K*V + C^2/3`` (about 0.18 MFLOP at C = 64, K = V = 128); the
    backward is about 2.6 times the forward. Bytes are the floor: each input read once and each output written
    once (:func:`io_bytes`); the backward reads the inputs and ``do`` and writes a gradient of each input.
    """
    B, T, H, K, V = (dims[d] for d in INDEXED_DIMS)
    if mode == "decode":
        # 7*K*V per token and head: decay, S^T k, the rank-1 update, S^T q
        inputs, out, state = io_bytes(contract, dims, elem)
        return decode_work(B * T * H * 7 * K * V, inputs, out, 2 * state)
    C = CHUNK
    fwd_flops = B * T * H * (5 * C * (K + V) + 6 * K * V + C * C / 3)
    return fwd_bwd_work(fwd_flops, *io_bytes(contract, dims, elem), mode)


def decode_work(flops: float, inputs: int, out: int, state_traffic: float) -> dict[str, float]:
    """``{"flops", "bytes", "state_bytes"}`` of a decode step (mode ``decode``): the token-serial recurrence's FLOP
    and the floor of its traffic: the state's (``state_bytes``: the delta family's whole state read and written
    once, which bounds a decode step at any batch; sdm's touched slots), the new tokens' inputs read and their
    outputs written."""
    return {"flops": float(flops), "bytes": float(inputs + out + state_traffic), "state_bytes": float(state_traffic)}


def fwd_bwd_work(fwd_flops: float, inputs: int, out: int, state: int, mode: str) -> dict[str, float]:
    """``{"flops", "bytes"}`` of `mode` from the forward's FLOP and the I/O floor: the backward about 2.6 times the
    forward's FLOP, reading the inputs and ``do`` and writing a gradient of each input."""
    fwd_bytes = inputs + out + state
    bwd_flops = 2.6 * fwd_flops
    bwd_bytes = 2 * inputs + out + 2 * state
    if mode == "fwd":
        return {"flops": float(fwd_flops), "bytes": float(fwd_bytes)}
    if mode == "bwd":
        return {"flops": float(bwd_flops), "bytes": float(bwd_bytes)}
    return {"flops": float(fwd_flops + bwd_flops), "bytes": float(fwd_bytes + bwd_bytes)}


def streaming_work(flops_per_element: float) -> WorkModel:
    """A work model for an elementwise scan: `flops_per_element` per element of the output, the I/O floor for
    bytes, the backward about 2.6 times the forward (as :func:`chunked_delta_work` assumes)."""

    def work(contract: OpContract, dims: Mapping[str, int], elem: int, mode: str) -> dict[str, float]:
        return fwd_bwd_work(flops_per_element * contract.output.numel(dims), *io_bytes(contract, dims, elem), mode)

    return work


@dataclasses.dataclass(frozen=True)
class OpContract:
    """Everything the harness knows of an op, declared beside its oracle.

    Attributes:
        name, title, rule: the op's id, its readable name and its per-token update (for docs and ``list``).
        dims: the named dims, in the order a shape is written (``B=2,T=200,...``).
        inputs: the positional inputs in call order.
        output, state: the output and the state (passed as keyword ``state.name``, returned as the final state).
        oracle: the float64 reference, same call convention.
        make_inputs: ``make_inputs(**dims, dtype=, device=, seed=, regime=, <state.name>=bool[, unit_qk=])`` ->
            ``{name: tensor}`` (the state under ``state.name`` when asked).
        regimes: the input regimes ``make_inputs`` draws.
        dim_defaults: ``(dim, from_dim)`` pairs: a dim left out of a shape takes another's value (V = K).
        scale: ``(input, dim)`` when the op takes ``scale=`` multiplying that input (default ``dim ** -0.5``).
        unit_norm_variant: ``make_inputs`` takes ``unit_qk`` (the gate also draws inputs off the unit sphere).
        work: the FLOP and byte model.
        oracle_shrink: the dims cut to fit the oracle's budget, in order, after T is cut (:meth:`shrink`).
        cost_dims: the dims whose product is the oracle's cost (default: every dim).
        streaming: the streaming split applies (T1 tokens, then the rest from the returned state).
        deterministic: results must be bitwise deterministic (the gate's determinism record always gates).
        zero_token_is_identity: a token whose inputs are all zero leaves the state unchanged and outputs zero (the
            oracle may then pad shorter sequences to stack them).
        options: the keyword arguments ``make_inputs`` returns beside the tensors (sdm's ``num_slots``,
            ``key_weighted_decay``), passed to the impl and the oracle as they are.
        check_dims: ``check_dims(dims) -> str | None``, why a shape is not a valid instance of the op beyond every
            dim being at least 1 (sdm: W and R at most S), or None (:meth:`dims_problem`).
        decode: the op has mode ``decode`` (T = 1..8 new tokens from a given state; its oracle steps from that
            state, drawn as :data:`DECODE_PREFIX` tokens of the op itself leave it: harness/ops.make_case_inputs);
            its work model then counts the step's state traffic as ``state_bytes`` (:func:`decode_work`).
        varlen: the op takes packed sequences (:data:`CU_SEQLENS`): B = 1, the sequences concatenated along T,
            the state one row per sequence; its oracle is then run sequence by sequence.
        reference_impl: the impl, run in float32, that stands in for the oracle at a shape too costly for it (the
            gate's full-shape reference, the timed calls' re-checks): the delta family's ``torch_chunk``.
        training: the op is a model's per-token loss (:class:`Training`): its ``fwd+bwd`` jobs time a whole
            training step and its gate also checks that training lowers the loss; None for a kernel op.
    """

    name: str
    title: str
    dims: tuple[str, ...]
    inputs: tuple[ArgSpec, ...]
    output: ArgSpec
    state: ArgSpec
    oracle: Callable[..., Any]
    make_inputs: Callable[..., dict[str, Any]]
    rule: str = ""
    regimes: tuple[str, ...] = REGIMES
    dim_defaults: tuple[tuple[str, str], ...] = ()
    scale: tuple[str, str] | None = None
    unit_norm_variant: bool = False
    work: WorkModel = chunked_delta_work
    oracle_shrink: tuple[str, ...] = ("B",)
    cost_dims: tuple[str, ...] | None = None
    streaming: bool = True
    deterministic: bool = False
    zero_token_is_identity: bool = True
    options: tuple[str, ...] = ()
    check_dims: Callable[[Mapping[str, int]], str | None] | None = None
    decode: bool = False
    varlen: bool = False
    reference_impl: str = "torch_chunk"
    training: Training | None = None

    def __post_init__(self) -> None:
        bad = [d for d in self.dims if not _DIM_NAME.fullmatch(d)]
        if bad:
            raise ValueError(f"op {self.name!r}: dim names are upper-case letters, not {bad}")
        if self.dims[:1] != ("B",):
            raise ValueError(f"op {self.name!r}: the first dim is the batch dim B, got {self.dims}")
        for a in (*self.inputs, self.output, self.state):
            unknown = [d for d in a.layout if d not in self.dims]
            if unknown:
                raise ValueError(f"op {self.name!r}: {a.name} uses dims {unknown} not among {self.dims}")
            if a.layout[:1] != ("B",):
                raise ValueError(f"op {self.name!r}: {a.name} must start with the batch dim B, got {a.layout}")

    @property
    def args(self) -> tuple[str, ...]:
        """The positional input names, in call order."""
        return tuple(a.name for a in self.inputs)

    @property
    def signature(self) -> str:
        """How an impl of the op is called and what it returns, as the gate and the timers call it: the inputs
        in order, then ``scale`` where the op takes one, the options ``make_inputs`` returns, and the state."""
        keywords = (*(("scale",) if self.scale is not None else ()), *self.options, f"{self.state_arg}=None")
        return f"{self.name}({', '.join((*self.args, *keywords))}) -> ({self.output.name}, final_state)"

    @property
    def gates(self) -> tuple[ArgSpec, ...]:
        """The delta family's gates: the inputs after q, k, v (the one gate list; kernels' checks read it)."""
        return self.inputs[3:] if self.args[:3] == ("q", "k", "v") else ()

    @property
    def state_arg(self) -> str:
        """The keyword that passes the initial state."""
        return self.state.name

    @property
    def grad_inputs(self) -> tuple[str, ...]:
        """Every input that has a gradient (the state included when given)."""
        return (*(a.name for a in self.inputs if a.differentiable), self.state_arg)

    def arg(self, name: str) -> ArgSpec:
        """The input (or the state) called `name`."""
        for a in (*self.inputs, self.state):
            if a.name == name:
                return a
        raise KeyError(f"op {self.name!r} has no input {name!r}")

    def complete_dims(self, given: Mapping[str, int]) -> dict[str, int]:
        """`given` with the defaulted dims filled in, in the contract's order; ValueError names what is missing."""
        dims = dict(given)
        for dim, source in self.dim_defaults:
            if dim not in dims and source in dims:
                dims[dim] = dims[source]
        unknown = [d for d in dims if d not in self.dims]
        if unknown:
            known = ", ".join(self.dims)
            raise ValueError(f"unknown dimension {', '.join(unknown)} for op {self.name}: dims are {known}")
        missing = [d for d in self.dims if d not in dims]
        if missing:
            raise ValueError(f"op {self.name} needs {', '.join(missing)} (dims {', '.join(self.dims)})")
        return {d: int(dims[d]) for d in self.dims}

    def dims_problem(self, dims: Mapping[str, int]) -> str | None:
        """Why complete `dims` are not a valid shape of the op (the contract's own rule), or None."""
        return self.check_dims(dims) if self.check_dims is not None else None

    def default_scale(self, dims: Mapping[str, int]) -> float | None:
        """The default ``scale`` (``dim ** -0.5``), or None when the op takes no scale."""
        return None if self.scale is None else dims[self.scale[1]] ** -0.5

    def cost(self, dims: Mapping[str, int]) -> float:
        """The oracle's cost at `dims` in element-steps: the product of :attr:`cost_dims` (default every dim:
        B*T*H*K*V for the delta family)."""
        return float(math.prod(dims[d] for d in (self.cost_dims or self.dims)))

    def shrink(self, dims: Mapping[str, int], limit: float, short_t: int) -> dict[str, int]:
        """`dims` cut until the oracle can afford them: T to `short_t`, then each of :attr:`oracle_shrink` to 1 in
        order, the last to what fits the budget `limit`."""
        out = dict(dims)
        out["T"] = min(out["T"], short_t)
        for i, d in enumerate(self.oracle_shrink):
            if self.cost(out) <= limit:
                break
            last = i == len(self.oracle_shrink) - 1
            rest = self.cost(out) / out[d]
            out[d] = max(1, int(limit // rest)) if last else 1
        return out


def delta_contract(
    name: str,
    title: str,
    gates: tuple[ArgSpec, ...],
    *,
    oracle: Callable[..., Any],
    make_inputs: Callable[..., dict[str, Any]],
    rule: str,
    **options: Any,
) -> OpContract:
    """A delta-rule op: ``fn(q, k, v, *gates, scale=None, initial_state=None) -> (o, final_state)`` over dims
    B, T, H, K, V (V defaults to K), q, k ``[B,T,H,K]``, v and o ``[B,T,H,V]``, a float32 state ``[B,H,K,V]``, the
    chunked-delta work model, the oracle cut along B then H; packed sequences (``cu_seqlens``) allowed."""
    return OpContract(
        name=name,
        title=title,
        dims=INDEXED_DIMS,
        inputs=(ArgSpec("q", "BTHK"), ArgSpec("k", "BTHK"), ArgSpec("v", "BTHV"), *gates),
        output=ArgSpec("o", "BTHV"),
        state=ArgSpec("initial_state", "BHKV", "float32", optional=True),
        oracle=oracle,
        make_inputs=make_inputs,
        rule=rule,
        dim_defaults=(("V", "K"),),
        scale=("q", "K"),
        unit_norm_variant=True,
        oracle_shrink=("B", "H"),
        varlen=True,
        **{"decode": True, **options},
    )


# ------------------------------------------------------------------------------------------------ shapes as text


def order_dims(dims: Mapping[str, int]) -> dict[str, int]:
    """`dims` in the one order shapes are written: the indexed dims B, T, H, K, V first, then the others sorted by
    name (so that a shape stored without its op's contract reads back the same)."""
    ordered = {d: int(dims[d]) for d in INDEXED_DIMS if d in dims}
    ordered.update({d: int(dims[d]) for d in sorted(dims) if d not in ordered})
    return ordered


def shape_id(dims: Mapping[str, int], seqlens: Sequence[int] | None = None, seqlens_from: str = "") -> str:
    """The readable id of a shape, ``B2-T200-H4-K64-V64`` (``B2-T100-D8`` for an op of dims B, T, D); packed
    sequences add their count N and, when drawn, their distribution (``B1-T300-H2-K32-V32-N4``,
    ``B1-T32768-H16-K128-V128-N17-lognormal(mean=2048,sigma=1,total=32768,seed=0)``)."""
    base = "-".join(f"{d}{v}" for d, v in order_dims(dims).items())
    if seqlens is None:
        return base
    return f"{base}-N{len(seqlens)}" + (f"-{seqlens_from}" if seqlens_from else "")


def parse_dims(text: str) -> dict[str, int]:
    """Read ``B=2,T=200,H=4`` or a shape id ``B2-T200-H4`` (any dim names) into ``{dim: size}``.

    Raises ValueError naming the malformed part or a dim given twice; sizes are not checked here.
    """
    dims: dict[str, int] = {}
    parts = [p for p in re.split(r"[-,\s]+", str(text).strip()) if p]
    # one form or the other: ``B2,T=3`` is more likely a typo than a shape
    form = r"([A-Za-z]+)=(\d+)" if "=" in str(text) else r"([A-Za-z]+)(\d+)"
    for part in parts:
        m = re.fullmatch(form, part.replace(" ", ""))
        if not m:
            raise ValueError(f"malformed shape {text!r}: expected e.g. B=2,T=200,H=4,K=64,V=64 or B2-T200-H4-K64-V64")
        key = m.group(1).upper()
        if key in dims:
            raise ValueError(f"dimension {key} given twice in shape {text!r}")
        dims[key] = int(m.group(2))
    return dims
