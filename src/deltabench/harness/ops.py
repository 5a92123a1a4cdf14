"""The op registry: every op's contract (references/contract.py's OpContract), by name.

The built-in contracts are declared beside their oracles (``references/<op>.py``'s ``CONTRACT``); a user's file or
package adds one with :func:`register_op` (or the entry-point group ``deltabench.ops``, whose entry points name a
contract, a module that registers one, or a callable that does). Everything the harness knows of an op (its dims,
inputs, output and state shapes, its work model, the checks that apply) it reads from here.
"""

from __future__ import annotations

import importlib
import sys
from importlib.metadata import entry_points
from typing import Any

import torch

from deltabench.references import builtin_op_modules
from deltabench.references.contract import CHUNK, CU_SEQLENS, DECODE_PREFIX, ArgSpec, OpContract

from .document import CLI_REMEDY, register_op_name, unknown_op_reason
from .errors import BadInput, UnknownOp
from .seqlens import cu_seqlens

__all__ = ["CHUNK", "OPS", "ArgSpec", "OpContract", "OpSpec", "get_op", "make_case_inputs", "register_op", "work"]

OpSpec = OpContract  # the name the harness used for a contract before contracts lived beside their oracles


def _builtin_contracts() -> dict[str, OpContract]:
    """Each ``references/<op>.py``'s CONTRACT, by name; a module whose contract names another op is a bug."""
    found = {}
    for module in builtin_op_modules():
        contract = importlib.import_module(f"deltabench.references.{module}").CONTRACT
        if contract.name != module:
            raise RuntimeError(f"references/{module}.py declares op {contract.name!r}: name the module after its op")
        found[module] = contract
    return found


OPS: dict[str, OpContract] = _builtin_contracts()
_BUILTIN = frozenset(OPS)
_ENTRY_POINTS_LOADED = False


def register_op(contract: OpContract) -> OpContract:
    """Add `contract` to the ops (a user's ``--import`` file or a plug-in calls it); returns it unchanged.

    Registering a name again replaces the earlier contract (a user's file may be re-imported), but a built-in op
    cannot be replaced. Result documents may carry the op from then on.
    """
    if not isinstance(contract, OpContract):
        raise BadInput(f"register_op takes an OpContract, got {type(contract).__name__}")
    if contract.name in _BUILTIN and OPS[contract.name] is not contract:
        raise BadInput(f"op {contract.name!r} is built in: register your op under another name")
    OPS[contract.name] = contract
    register_op_name(contract.name)
    return contract


def load_entry_point_ops() -> None:
    """Register the ops of the ``deltabench.ops`` entry points once (a broken plug-in is reported, not fatal)."""
    global _ENTRY_POINTS_LOADED
    if _ENTRY_POINTS_LOADED:
        return
    _ENTRY_POINTS_LOADED = True
    for ep in entry_points(group="deltabench.ops"):
        try:
            obj: Any = ep.load()
            if isinstance(obj, OpContract):
                register_op(obj)
            elif callable(obj) and not isinstance(obj, type(sys)):
                obj()
        except Exception as exc:
            print(f"deltabench: op entry point {ep.name!r} failed to load: {exc}", file=sys.stderr)


def get_op(name: str, remedy: str = CLI_REMEDY) -> OpContract:
    """The contract of op `name`, or UnknownOp saying how to load it (`remedy`: a command's --import by default;
    the server passes its own) and naming the known ones."""
    if name not in OPS:
        load_entry_point_ops()
    try:
        return OPS[name]
    except KeyError:
        raise UnknownOp(f"{unknown_op_reason(name, remedy)} (known ops: {', '.join(OPS)})") from None


def make_case_inputs(contract: OpContract, case: Any, *, unit_qk: bool = True) -> dict[str, Any]:
    """The seeded inputs of `case` (a harness Case) as the contract's ``make_inputs`` draws them, on the case's torch
    device in its dtype; the initial state when the case has one; for packed sequences (``case.seqlens``) also
    ``cu_seqlens`` (int32 [N + 1]) and a state of N rows. `unit_qk=False` (ops with ``unit_norm_variant``) draws q
    and k off the unit sphere. A ``decode`` case always has a state, the one :func:`decode_state` draws."""
    draws = {"unit_qk": unit_qk} if contract.unit_norm_variant else {}
    common = {"dtype": case.torch_dtype, "device": case.torch_device, "regime": case.regime, **draws}
    packed = getattr(case, "seqlens", None)
    decode = case.mode == "decode"
    with_state = (case.initial_state or decode) and packed is None
    inputs = contract.make_inputs(**case.dims, seed=case.seed, **{contract.state_arg: with_state}, **common)
    if decode:
        inputs[contract.state_arg] = decode_state(contract, case, unit_qk=unit_qk)
    if packed is not None:
        # One state row per sequence: drawn as the state of a batch of N one-token rows, from a seed of its own.
        if case.initial_state:
            rows = {**case.dims, "B": len(packed), "T": 1}
            drawn = contract.make_inputs(
                **rows, seed=case.seed + _PACKED_STATE_SEED, **{contract.state_arg: True}, **common
            )
            inputs[contract.state_arg] = drawn[contract.state_arg]
        inputs[CU_SEQLENS] = torch.tensor(cu_seqlens(packed), dtype=torch.int32, device=case.torch_device)
    return inputs


# The packed states' draws: a stream apart from the sequences' (and from the cotangents', correctness/calls.py).
_PACKED_STATE_SEED = 2_000_003


# The prefix's inputs come from a stream of their own, apart from the new tokens' (seed + this).
_PREFIX_SEED_OFFSET = 7_000_003


def decode_state(contract: OpContract, case: Any, *, unit_qk: bool = True) -> Any:
    """The state a decode case steps from: the op's float64 oracle run over :data:`DECODE_PREFIX` seeded tokens of
    the case's regime (B, H and the other dims the case's; float32 inputs) from a random state, rounded to float32.
    Such a state has the magnitude and the structure (the decayed sum of rank-1 writes along past keys) that a
    served sequence leaves, which a zero or white-noise state lacks: a kernel that drops the decay or the delta
    correction is then off by the state's own size."""
    draws = {"unit_qk": unit_qk} if contract.unit_norm_variant else {}
    prefix = contract.make_inputs(
        **{**case.dims, "T": DECODE_PREFIX},
        dtype=torch.float32,
        device=case.torch_device,
        seed=case.seed + _PREFIX_SEED_OFFSET,
        regime=case.regime,
        **{contract.state_arg: True},
        **draws,
    )
    options = {n: x for n, x in prefix.items() if not isinstance(x, torch.Tensor)}
    scale = {"scale": contract.default_scale(case.dims)} if contract.scale is not None else {}
    h0 = {contract.state_arg: prefix[contract.state_arg]}
    with torch.no_grad():
        _, state = contract.oracle(*(prefix[n] for n in contract.args), **scale, **h0, **options)
    return state.to(torch.float32).contiguous()


_ELEM_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


def work(op: str, dims: dict[str, int], dtype: str, mode: str) -> dict[str, float]:
    """FLOP and minimum-byte counts of one call of `op` at `dims` (the op's work model: the delta family's is the
    chunked-delta model, references/contract.chunked_delta_work). Returns ``{"flops", "bytes"}``."""
    contract = get_op(op)
    return contract.work(contract, dims, _ELEM_BYTES[dtype], mode)
