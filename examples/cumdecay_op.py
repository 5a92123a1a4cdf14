"""A user's op in one file: a decayed cumulative sum with resets, its float64 oracle, its inputs and an impl.

    deltabench verify --import examples/cumdecay_op.py --op cumdecay --impl torch_loop --shape B=2,T=100,D=8
    deltabench run --import examples/cumdecay_op.py --suite my-cumdecay.toml

Dims B, T, D (none of them the delta family's H, K, V). Per token t, for each batch row::

    s <- (1 - reset_t) * exp(g_t) * s + x_t
    y_t = s

with x ``[B, T, D]`` in the case's dtype, the log-decay g ``[B, T]`` kept in float32, reset ``[B, T]`` an int64 flag
(no gradient) and the state s ``[B, D]`` in float32. A token whose x, g and reset are all zero leaves s unchanged.
"""

from __future__ import annotations

import torch

from deltabench.harness.ops import register_op
from deltabench.harness.registry import register_impl
from deltabench.references import _inputs
from deltabench.references.contract import ArgSpec, OpContract, streaming_work


def cumdecay_oracle(x, g, reset, initial_state=None):
    """Float64, one token at a time: ``(y [B, T, D], final state [B, D])``."""
    B, T, D = x.shape
    x, g = x.to(torch.float64), g.to(torch.float64)
    keep = 1.0 - reset.to(torch.float64)
    s = x.new_zeros(B, D) if initial_state is None else initial_state.to(torch.float64)
    ys = []
    for t in range(T):
        s = (keep[:, t] * g[:, t].exp())[:, None] * s + x[:, t]
        ys.append(s)
    return (torch.stack(ys, dim=1) if ys else x.new_zeros(B, 0, D)), s


def make_inputs(B, T, D, *, dtype=torch.float32, device="cpu", seed=0, regime="typical", initial_state=False):
    """Seeded inputs: x ~ N(0, 1), g of the regime (references/_inputs.py), a reset about one token in 16."""
    gen = _inputs.generator(seed)
    out = {
        "x": _inputs.randn(gen, B, T, D).to(device=device, dtype=dtype),
        "g": _inputs.log_decay(gen, regime, B, T, 1)[..., 0].to(device),
        "reset": (torch.rand(B, T, generator=gen) < 1 / 16).to(device=device, dtype=torch.int64),
    }
    if initial_state:
        out["initial_state"] = _inputs.randn(gen, B, D).to(device)
    return out


CONTRACT = register_op(
    OpContract(
        name="cumdecay",
        title="Decayed cumulative sum",
        dims=("B", "T", "D"),
        inputs=(
            ArgSpec("x", "BTD"),
            ArgSpec("g", "BT", "float32"),
            ArgSpec("reset", "BT", "index", differentiable=False),
        ),
        output=ArgSpec("y", "BTD"),
        state=ArgSpec("initial_state", "BD", "float32", optional=True),
        oracle=cumdecay_oracle,
        make_inputs=make_inputs,
        rule="s <- (1 - reset) exp(g) s + x; y = s",
        work=streaming_work(3.0),  # a multiply, a multiply-add per element of y
    )
)


@register_impl("cumdecay", "torch_loop", backend="torch", devices=("cpu", "cuda"), dtypes=("fp32", "bf16"))
def cumdecay_torch_loop(x, g, reset, initial_state=None):
    """The impl under test: the same recurrence with a float32 state, y in x's dtype."""
    B, T, D = x.shape
    decay = (1.0 - reset.float()) * g.float().exp()
    s = x.new_zeros(B, D, dtype=torch.float32) if initial_state is None else initial_state.float()
    ys = []
    for t in range(T):
        s = decay[:, t, None] * s + x[:, t].float()
        ys.append(s)
    y = torch.stack(ys, dim=1) if ys else x.new_zeros(B, 0, D, dtype=torch.float32)
    return y.to(x.dtype), s
