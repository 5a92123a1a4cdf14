"""A small language model's training step (``lm_step``): its contract, its float64 oracle, its inputs and its step.

The model, per batch row (weights per row, as gdn_layer's: the op is B models side by side, and ``make_inputs``
draws the same weights for every row, so that a row is one sequence through one model)::

    h = embed[tokens]                                        [T, D]
    for each of L layers:
        h = h + mixer block(rmsnorm(h) * norm_mix)           references/gdn_layer.py's block, its recurrence the mixer
        h = h + silu(rmsnorm(h) * norm_mlp  W_up) W_down     MLP of F = 4D hidden units
    loss_t = cross_entropy(rmsnorm(h) * norm_out  W_unembed, targets_t)     [T], per token

The op's output is the per-token loss (float32), its state the L mixer blocks' packed states side by side
(``[B, L * gdn_layer.state_width]``, float32): running T1 tokens and then the rest from the returned state gives
the same losses as all T at once. The oracle runs every block in float64, its recurrence token by token
(references/gdn.gdn_recurrent). A training step (:func:`train_step`) minimises the mean of the per-token losses
with AdamW (torch.optim.AdamW, :func:`make_optimizer`); :func:`memorise` trains a few steps on one fixed sequence.

Nothing here imports the rest of deltabench.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
import torch.nn.functional as F

from . import _inputs as _in
from . import gdn_layer as _layer
from .contract import CHUNK, ArgSpec, OpContract, Training, fwd_bwd_work, io_bytes
from .gdn import gdn_recurrent

__all__ = [
    "CONTRACT",
    "MIXER_DTYPES",
    "MLP_RATIO",
    "PARAMS",
    "lm_forward",
    "lm_oracle",
    "make_inputs",
    "make_optimizer",
    "memorise",
    "rounded",
    "train_step",
]

MLP_RATIO = 4  # the MLP's hidden units per model dim (F = 4 D)
# The parameters after tokens and targets, in call order: the embedding, each layer's weights stacked along L
# (gdn_layer's WEIGHTS, then the two norms and the MLP), the output norm and the unembedding.
_LAYER = (*_layer.WEIGHTS, "norm_mix", "norm_mlp", "w_up", "w_down")
PARAMS = ("embed", *_LAYER, "norm_out", "unembed")
_NORM_EPS = 1e-6

# A mixer: (q, k, v, g, beta, scale=, initial_state=) -> (o, final_state), as every gdn impl is called.
Mixer = Callable[..., tuple[torch.Tensor, torch.Tensor]]
_WRAP: contextvars.ContextVar[Callable[[Mixer], Mixer] | None] = contextvars.ContextVar("lm_mixer_wrap", default=None)


@contextlib.contextmanager
def wrap_mixer(wrap: Callable[[Mixer], Mixer]) -> Iterator[None]:
    """Within the block, :func:`lm_forward` calls its mixer through ``wrap(mixer)`` (to time the mixer's calls)."""
    token = _WRAP.set(wrap)
    try:
        yield
    finally:
        _WRAP.reset(token)


def _rmsnorm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """RMSNorm of ``x [B, T, D]`` over D with weight ``w [B, D]``."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + _NORM_EPS) * w[:, None]


def lm_forward(
    mixer: Mixer,
    compute: torch.dtype,
    tokens: torch.Tensor,
    targets: torch.Tensor,
    *params: torch.Tensor,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The model with `mixer` as every block's recurrence, everything else in `compute` (the oracle's float64, an
    impl's case dtype); returns ``(per-token loss [B, T], packed states [B, L * width])``, the loss in float32 (in
    float64 for the oracle), the state as gdn_layer's block returns it."""
    p = dict(zip(PARAMS, params, strict=True))
    B, T = tokens.shape
    L = p["norm_mix"].shape[1]
    mixer = (_WRAP.get() or (lambda m: m))(mixer)
    rows = torch.arange(B, device=tokens.device)[:, None]
    h = p["embed"].to(compute)[rows, tokens]
    width = initial_state.shape[1] // L if initial_state is not None else 0
    states = []
    for layer in range(L):
        w = {n: p[n][:, layer].to(compute) for n in _LAYER}
        h0 = None if initial_state is None else initial_state[:, layer * width : (layer + 1) * width]
        x = _rmsnorm(h, w["norm_mix"])
        y, state = _layer.gdn_layer_block(mixer, compute, x, *(w[n] for n in _layer.WEIGHTS), initial_state=h0)
        h = h + y
        u = _rmsnorm(h, w["norm_mlp"])
        h = h + torch.einsum("btf,bfd->btd", F.silu(torch.einsum("btd,bdf->btf", u, w["w_up"])), w["w_down"])
        states.append(state)
    logits = torch.einsum("btd,bdn->btn", _rmsnorm(h, p["norm_out"].to(compute)), p["unembed"].to(compute))
    wide = torch.float64 if compute == torch.float64 else torch.float32
    loss = F.cross_entropy(logits.to(wide).flatten(0, 1), targets.flatten(), reduction="none").reshape(B, T)
    return loss, torch.cat(states, dim=1)


# The mixer's dtype, by the name make_inputs returns it under (the option ``mixer_dtype``).
MIXER_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp64": torch.float64}


def rounded(mixer: Mixer, dtype: str) -> Mixer:
    """`mixer` as the model calls it, in `dtype`: its q, k, v and beta rounded to `dtype` and its output too, the
    gradients through those casts rounded as a model's autograd rounds them (the oracle's model, whose mixer then
    runs in float64 on the rounded values)."""

    def cast(x: torch.Tensor) -> torch.Tensor:
        return x.to(MIXER_DTYPES[dtype]).to(x.dtype)

    def mix(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, **kw: Any) -> Any:
        o, state = mixer(cast(q), cast(k), cast(v), g, cast(beta), **kw)
        return cast(o), state

    return mix


def lm_oracle(
    tokens: torch.Tensor,
    targets: torch.Tensor,
    *params: torch.Tensor,
    mixer_dtype: str = "fp32",
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The model in float64, every block's recurrence token by token (references/gdn.gdn_recurrent) on its inputs
    rounded to `mixer_dtype`."""
    mixer = rounded(gdn_recurrent, mixer_dtype)
    return lm_forward(mixer, torch.float64, tokens, targets, *params, initial_state=initial_state)


def make_inputs(
    B: int,
    T: int,
    H: int,
    K: int,
    V: int,
    D: int,
    L: int,
    VOCAB: int,
    *,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    seed: int = 0,
    regime: str = "typical",
    initial_state: bool = False,
) -> dict[str, torch.Tensor]:
    """Seeded inputs: tokens and targets uniform over the vocabulary; each layer's mixer weights as gdn_layer draws
    them (its decay rates per `regime`); the embedding N(0, 1), the MLP and the unembedding N(0, 1/fan_in), the norms
    1 + N(0, 0.01). Weights are drawn once and repeated in every batch row. With `initial_state`, each layer's packed
    state as gdn_layer draws it."""
    gen = _in.generator(seed, device)
    on = gen.device
    idx = {n: torch.randint(0, VOCAB, (B, T), generator=gen, device=on).to(device) for n in ("tokens", "targets")}
    Fh = MLP_RATIO * D
    one = {
        "embed": _in.randn(gen, 1, VOCAB, D),
        "norm_mix": 1 + 0.1 * _in.randn(gen, 1, L, D),
        "norm_mlp": 1 + 0.1 * _in.randn(gen, 1, L, D),
        "w_up": _in.randn(gen, 1, L, D, Fh) * D**-0.5,
        "w_down": _in.randn(gen, 1, L, Fh, D) * Fh**-0.5,
        "norm_out": 1 + 0.1 * _in.randn(gen, 1, D),
        "unembed": _in.randn(gen, 1, D, VOCAB) * D**-0.5,
    }
    layers = [
        _layer.make_inputs(
            1, 1, D, H, K, V, dtype=torch.float32, device=device, seed=seed + 7919 * (i + 1), regime=regime,
        )
        for i in range(L)
    ]  # fmt: skip
    for n in _layer.WEIGHTS:
        one[n] = torch.stack([lay[n].to(on) for lay in layers], dim=1)
    t = {n: one[n].expand(B, *one[n].shape[1:]) for n in PARAMS}
    if initial_state:
        # each layer's state drawn for one row by gdn_layer, then B rows of their own
        rows = [
            _layer.make_inputs(
                B, 1, D, H, K, V, dtype=torch.float32, device=device, seed=seed + 104_729 * (i + 1), regime=regime,
                initial_state=True,
            )["initial_state"].to(on)
            for i in range(L)
        ]  # fmt: skip
        t["initial_state"] = torch.cat(rows, dim=1)
    name = next(n for n, dt in MIXER_DTYPES.items() if dt == dtype)
    return {**idx, **_in.finish(t, dtype=dtype, device=device, keep_fp32=("initial_state",)), "mixer_dtype": name}


# AdamW as small language models are trained with; its numbers only shape the memorisation run (the timed step's
# arithmetic does not depend on them).
LR, BETAS, WEIGHT_DECAY = 1e-3, (0.9, 0.95), 0.1


def make_optimizer(params: list[torch.Tensor], lr: float = LR) -> torch.optim.Optimizer:
    """torch's AdamW over `params` (the op's differentiable inputs, as leaves)."""
    return torch.optim.AdamW(params, lr=lr, betas=BETAS, weight_decay=WEIGHT_DECAY)


def train_step(
    fn: Callable[..., Any], args: list[torch.Tensor], optimizer: torch.optim.Optimizer, **kwargs: Any
) -> torch.Tensor:
    """One step of `fn` on its positional `args`: the mean per-token loss, its backward, the optimizer's step."""
    optimizer.zero_grad(set_to_none=True)
    per_token, _ = fn(*args, **kwargs)
    loss = per_token.float().mean()
    loss.backward()
    optimizer.step()
    return loss.detach()


# The memorisation check: MEMORISE_STEPS steps on one fixed sequence of at most MEMORISE_T tokens (its next-token
# targets) at MEMORISE_LR; the last loss must be under MEMORISE_FRACTION of the first. Measured on the CPU at fp32:
# see docs/ops/lm-step.md (every built-in impl ends well under the bound, a broken step stays near its first loss).
MEMORISE_STEPS, MEMORISE_T, MEMORISE_LR, MEMORISE_FRACTION = 30, 64, 1e-2, 0.5


def memorise(
    fn: Callable[..., Any], dims: Mapping[str, int], *, dtype: torch.dtype, device: str, seed: int = 0
) -> tuple[list[float], float]:
    """The losses of :data:`MEMORISE_STEPS` training steps of `fn` on one sequence (B = 1, at most
    :data:`MEMORISE_T` tokens of the case's dims, its targets the next tokens), and the bound the last loss must be
    under (:data:`MEMORISE_FRACTION` of the first)."""
    small = {**dims, "B": 1, "T": min(int(dims["T"]), MEMORISE_T)}
    inputs = make_inputs(**small, dtype=dtype, device=device, seed=seed)
    seq = torch.cat([inputs["tokens"], inputs["targets"][:, -1:]], dim=1)
    params = [inputs[n].detach().clone().requires_grad_(True) for n in PARAMS]
    optimizer = make_optimizer(params, lr=MEMORISE_LR)
    args = [seq[:, :-1].contiguous(), seq[:, 1:].contiguous(), *params]
    kw = {"mixer_dtype": inputs["mixer_dtype"]}
    losses = [float(train_step(fn, args, optimizer, **kw)) for _ in range(MEMORISE_STEPS)]
    return losses, MEMORISE_FRACTION * losses[0]


def _lm_work(contract: OpContract, dims: Mapping[str, int], elem: int, mode: str) -> dict[str, float]:
    """FLOP per token of the forward: 2 per weight of every matmul (the blocks' projections, the MLP, the
    unembedding) plus L chunked recurrences (contract.chunked_delta_work's figure); the backward twice the forward
    (two matmuls per forward one); bytes: the I/O floor."""
    B, T, H, K, V, D, L, N = (dims[d] for d in ("B", "T", "H", "K", "V", "D", "L", "VOCAB"))
    per_layer = 2 * D * (2 * H * K + 3 * H * V) + 2 * H * V * D + 2 * 2 * D * MLP_RATIO * D
    recurrence = H * (5 * CHUNK * (K + V) + 6 * K * V + CHUNK * CHUNK / 3)
    fwd = B * T * (L * (per_layer + recurrence) + 2 * D * N)
    inputs, out, state = io_bytes(contract, dims, elem)
    w = fwd_bwd_work(fwd, inputs, out, state, mode)
    w["flops"] = {"fwd": fwd, "bwd": 2 * fwd}.get(mode, 3 * fwd)
    return w


def _mlp_extent(first: str) -> Callable[[Mapping[str, int]], tuple[int, ...]]:
    f = lambda d: MLP_RATIO * d["D"]
    if first == "D":
        return lambda d: (d["B"], d["L"], d["D"], f(d))
    return lambda d: (d["B"], d["L"], f(d), d["D"])


def _conv(last: str) -> Callable[[Mapping[str, int]], tuple[int, ...]]:
    return lambda d: (d["B"], d["L"], _layer.CONV, d["H"], d[last])


_LAYER_SPECS = {
    "w_q": ("D", "H", "K"),
    "w_k": ("D", "H", "K"),
    "w_v": ("D", "H", "V"),
    "w_b": ("D", "H"),
    "w_a": ("D", "H"),
    "a_log": ("H",),
    "dt_bias": ("H",),
    "norm_w": ("V",),
    "w_gate": ("D", "H", "V"),
    "w_o": ("H", "V", "D"),
    "norm_mix": ("D",),
    "norm_mlp": ("D",),
}


def _param_spec(name: str) -> ArgSpec:
    if name == "embed":
        return ArgSpec(name, ("B", "VOCAB", "D"))
    if name == "norm_out":
        return ArgSpec(name, ("B", "D"))
    if name == "unembed":
        return ArgSpec(name, ("B", "D", "VOCAB"))
    if name.startswith("conv_"):
        last = "V" if name == "conv_v" else "K"
        return ArgSpec(name, ("B", "L", "H", last), extent=_conv(last))
    if name in ("w_up", "w_down"):
        return ArgSpec(name, ("B", "L", "D"), extent=_mlp_extent("D" if name == "w_up" else "F"))
    return ArgSpec(name, ("B", "L", *_LAYER_SPECS[name]))


def _state_extent(d: Mapping[str, int]) -> tuple[int, ...]:
    return (d["B"], d["L"] * _layer.state_width(d))


CONTRACT = OpContract(
    name="lm_step",
    title="Training step of a small LM",
    dims=("B", "T", "H", "K", "V", "D", "L", "VOCAB"),
    inputs=(
        ArgSpec("tokens", "BT", "index", differentiable=False),
        ArgSpec("targets", "BT", "index", differentiable=False),
        *(_param_spec(n) for n in PARAMS),
    ),
    output=ArgSpec("loss", "BT", "float32"),
    state=ArgSpec("initial_state", ("B", "L", "H", "K", "V"), "float32", optional=True, extent=_state_extent),
    oracle=lm_oracle,
    make_inputs=make_inputs,
    rule="h = embed(tokens); L x (h += mixer block(rmsnorm h); h += MLP(rmsnorm h)); loss = CE(rmsnorm h W_u)",
    dim_defaults=(("V", "K"),),
    work=_lm_work,
    oracle_shrink=("B", "H"),
    cost_dims=("B", "T", "L", "H", "K", "V"),
    zero_token_is_identity=False,
    options=("mixer_dtype",),
    reference_impl="gdn:torch_chunk",
    training=Training(optimizer=make_optimizer, step=train_step, memorise=memorise, wrap_mixer=wrap_mixer),
)
