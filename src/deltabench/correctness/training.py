"""The gate's check of an op that is a model's loss (its contract's ``training``): training lowers the loss.

The oracle comparison holds the step's loss and every parameter's gradient to the float64 model; what it cannot see
is the optimizer's step, which turns gradients into new parameters. ``loss falls`` trains the impl a few steps on one
fixed sequence (a memorisation task, references/lm_step.memorise) with the contract's own step and optimizer, and
fails unless the last loss is under the bound: an optimizer step that does not descend (a flipped sign, an update
that never reaches the parameters) leaves the loss where it started, and a broken mixer seldom memorises either.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from deltabench.harness.cases import Case
from deltabench.harness.document import CheckRecord
from deltabench.harness.ops import get_op

__all__ = ["loss_falls_record"]


def loss_falls_record(impl: Callable[..., Any], case: Case) -> CheckRecord:
    """``loss falls``: the memorisation run's last loss against its bound (gating), the first and last losses in
    its detail. A non-finite loss fails."""
    training = get_op(case.op).training
    losses, bound = training.memorise(impl, case.dims, dtype=case.torch_dtype, device=case.torch_device, seed=case.seed)
    last = losses[-1]
    passed = math.isfinite(last) and math.isfinite(bound) and last <= bound
    detail = f"{len(losses)} steps on one sequence: loss {losses[0]:.3f} -> {last:.3f} (must end under {bound:.3f})"
    return CheckRecord(
        check="loss falls",
        metric="last_loss",
        value=last if math.isfinite(last) else None,
        threshold=bound if math.isfinite(bound) else None,
        passed=passed,
        seed=case.seed,
        regime=case.regime,
        reference="the same impl's first loss",
        detail=detail,
    )
