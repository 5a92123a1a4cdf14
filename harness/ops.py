"""Op contracts: argument names, gates, the float64 oracle, the input generator and the work model.

Every op follows FLA's layout and argument order: ``fn(q, k, v, *gates, scale=None, initial_state=None)``
returns ``(o, final_state)`` with q, k ``[B,T,H,K]``, v and o ``[B,T,H,V]``, state ``[B,H,K,V]`` float32.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from deltabench.references import gdn as _gdn
from deltabench.references import gdn2 as _gdn2
from deltabench.references import kda as _kda

from .errors import UnknownOp

__all__ = ["CHUNK", "OPS", "OpSpec", "get_op", "work"]

CHUNK = 64  # the chunk length the work model assumes (the chunked pipelines' C)


@dataclasses.dataclass(frozen=True)
class OpSpec:
    """The contract of one op."""

    name: str
    title: str
    gates: tuple[str, ...]  # gate argument names, in order, after (q, k, v)
    per_channel_gate: bool  # g is [B,T,H,K] rather than [B,T,H]
    oracle: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    make_inputs: Callable[..., dict[str, torch.Tensor]]
    rule: str  # the per-token update, for docs and `deltabench list`
    # The contract demands bitwise-deterministic results (two identical calls, identical bits): the gate's
    # determinism record is then gating for every impl of the op, not only under ``--deterministic``.
    deterministic: bool = False
    # A token whose q, k, v and gates are all zero leaves the state unchanged and outputs zero (true of every
    # delta rule here: decay exp(0) = 1, zero write): the gate then runs the oracle on sequences of different
    # lengths in one call, the shorter ones padded with such tokens.
    zero_token_is_identity: bool = True

    @property
    def args(self) -> tuple[str, ...]:
        """Positional argument names: q, k, v and the gates."""
        return ("q", "k", "v", *self.gates)

    @property
    def grad_inputs(self) -> tuple[str, ...]:
        """Every input that has a gradient (initial_state included when given)."""
        return (*self.args, "initial_state")


OPS: dict[str, OpSpec] = {
    "gdn": OpSpec(
        name="gdn",
        title="Gated DeltaNet",
        gates=("g", "beta"),
        per_channel_gate=False,
        oracle=_gdn.gdn_recurrent,
        make_inputs=_gdn.make_inputs,
        rule="S <- exp(g) S; u = beta (v - S^T k); S <- S + k u^T; o = S^T (scale q)",
    ),
    "gdn2": OpSpec(
        name="gdn2",
        title="Gated DeltaNet-2",
        gates=("g", "b", "w"),
        per_channel_gate=True,
        oracle=_gdn2.gdn2_recurrent,
        make_inputs=_gdn2.make_inputs,
        rule="S <- Diag(exp g) S; r = S^T (b*k); S <- S + k (w*v - r)^T; o = S^T (scale q)",
    ),
    "kda": OpSpec(
        name="kda",
        title="Kimi Delta Attention",
        gates=("g", "beta"),
        per_channel_gate=True,
        oracle=_kda.kda_recurrent,
        make_inputs=_kda.make_inputs,
        rule="S <- Diag(exp g) S; u = beta (v - S^T k); S <- S + k u^T; o = S^T (scale q)",
    ),
}


def get_op(name: str) -> OpSpec:
    """The contract of op `name`, or UnknownOp naming the known ones."""
    try:
        return OPS[name]
    except KeyError:
        raise UnknownOp(f"unknown op {name!r}: known ops are {', '.join(OPS)}") from None


_ELEM_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


def work(op: str, dims: dict[str, int], dtype: str, mode: str) -> dict[str, float]:
    """FLOP and minimum-byte counts of one call, as the chunked pipeline computes it.

    Forward FLOP per token per head: ``5*C*(K+V) + 6*K*V + C^2/3`` (ANCHORS: about 0.18 MFLOP at
    C = 64, K = V = 128); the backward is about 2.6 times the forward. Bytes are the floor: each input
    read once and each output written once (the state in float32). Returns ``{"flops", "bytes"}``.
    """
    spec = get_op(op)
    B, T, H, K, V = (dims[d] for d in ("B", "T", "H", "K", "V"))
    e = _ELEM_BYTES[dtype]
    C = CHUNK
    fwd_flops = B * T * H * (5 * C * (K + V) + 6 * K * V + C * C / 3)
    gate_elems = {"g": K if spec.per_channel_gate else 1, "beta": 1, "b": K, "w": V}
    gate_bytes = B * T * H * sum((4 if n == "g" else e) * gate_elems[n] for n in spec.gates)
    io = B * T * H * e * (2 * K + V)  # q, k, v
    out = B * T * H * e * V  # o
    state = B * H * K * V * 4
    fwd_bytes = io + gate_bytes + out + state
    if mode == "fwd":
        return {"flops": float(fwd_flops), "bytes": float(fwd_bytes)}
    # backward: read inputs and do, write a gradient of each input
    bwd_flops = 2.6 * fwd_flops
    bwd_bytes = 2 * (io + gate_bytes) + out + 2 * state
    if mode == "bwd":
        return {"flops": float(bwd_flops), "bytes": float(bwd_bytes)}
    return {"flops": float(fwd_flops + bwd_flops), "bytes": float(fwd_bytes + bwd_bytes)}
