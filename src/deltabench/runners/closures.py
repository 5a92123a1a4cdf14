"""Zero-argument closures that a timer calls: the impl's forward, forward+backward, or backward alone; for an op that
is a model's loss (its contract's ``training``), fwd+bwd is a whole training step, the optimizer's included.

Inputs (and, for the backward, the random cotangent ``do`` and the forward graph) are built here,
outside the timed region. fwd+bwd differentiates ``(o * do).sum()`` for a fixed random ``do``; bwd
times only the backward, replaying it over a graph built once (``retain_graph``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from deltabench.harness.cases import Case, has_backward
from deltabench.harness.ops import get_op
from deltabench.harness.registry import Impl
from deltabench.references._inputs import generator, randn
from deltabench.references.contract import CU_SEQLENS

__all__ = ["Subject", "build_subject", "cotangent"]

_COTANGENT_SEED_OFFSET = 7919  # do is drawn from its own stream, apart from the inputs' seed


def cotangent(case: Case, like: torch.Tensor) -> torch.Tensor:
    """The fixed random output cotangent ``do`` of `case` (seeded, drawn where `like` is: on a GPU, its generator,
    references/_inputs.py)."""
    gen = generator(case.seed + _COTANGENT_SEED_OFFSET, like.device)
    return randn(gen, *like.shape).to(device=like.device, dtype=like.dtype)


class Subject:
    """The closure to time, with the tensors it holds (for the memory figures)."""

    def __init__(self, fn: Callable[[], Any], held: dict[str, torch.Tensor]) -> None:
        self.fn = fn
        self.held = held

    def __call__(self) -> Any:
        return self.fn()


def build_subject(impl: Impl, case: Case, inputs: dict[str, torch.Tensor]) -> Subject:
    """The zero-argument closure for `case.mode` over `inputs` (as ``OpSpec.make_inputs`` returns them)."""
    spec = get_op(case.op)
    state_arg = spec.state_arg
    # what make_inputs returned beside the tensors (the contract's options) goes to every call as keywords
    options = {n: x for n, x in inputs.items() if not isinstance(x, torch.Tensor)}
    if CU_SEQLENS in inputs:  # packed sequences: their offsets go by keyword, as in the gate's calls
        options[CU_SEQLENS] = inputs[CU_SEQLENS]
    if not has_backward(case.mode):  # fwd, and decode: a forward from the state its inputs hold
        args = [inputs[n] for n in spec.args]
        h0 = {state_arg: inputs.get(state_arg), **options}

        def fwd() -> Any:
            with torch.no_grad():
                return impl(*args, **h0)

        return Subject(fwd, {n: x for n, x in inputs.items() if isinstance(x, torch.Tensor)})

    # The leaves are the contract's differentiable inputs (never an index tensor) and the state when given.
    names = [n for n in (*spec.args, state_arg) if n in inputs and inputs[n].is_floating_point()]
    names = [n for n in names if spec.arg(n).differentiable]
    leaves = {n: inputs[n].detach().clone().requires_grad_(True) for n in names}
    largs = [leaves.get(n, inputs[n]) for n in spec.args]
    lh0 = {state_arg: leaves.get(state_arg), **options}
    # the output's cotangent, in the contract's output shape and the case's dtype
    do = cotangent(case, torch.empty(spec.output.shape(case.dims), dtype=case.torch_dtype, device=case.torch_device))

    def loss() -> torch.Tensor:
        o, _ = impl(*largs, **lh0)
        return (o * do).sum()

    wrt = list(leaves.values())
    if case.mode == "fwd+bwd" and spec.training is not None:
        # A model's loss: the whole training step, the optimizer's step on the parameters included (its moments
        # allocated here, untimed; each call trains the parameters on).
        params = [leaves[n] for n in spec.args if n in leaves]
        optimizer = spec.training.optimizer(params)
        kwargs = {state_arg: leaves.get(state_arg), **options}

        def train_step() -> Any:
            return spec.training.step(impl, largs, optimizer, **kwargs)

        return Subject(train_step, dict(leaves))
    if case.mode == "fwd+bwd":

        def fwd_bwd() -> Any:
            return torch.autograd.grad(loss(), wrt, allow_unused=True)

        return Subject(fwd_bwd, {**leaves, "do": do})

    graph_loss = loss()  # the forward, once, untimed; each sample replays the backward over it

    def bwd() -> Any:
        return torch.autograd.grad(graph_loss, wrt, retain_graph=True, allow_unused=True)

    return Subject(bwd, {**leaves, "do": do})
