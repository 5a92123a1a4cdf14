"""``gate_shapes`` lists exactly the shapes a gate calls an impl at (correctness/verify.py): what a run compiles side by
side, before the gates, for an impl that compiles each new shape (runners/session.py). Checked against the calls
``verify_case`` really makes, recorded by a wrapper around a registered impl: every shape it calls is listed (with
the case's mode where a call there back-propagates), and nothing is listed that it never calls. ``warm_calls`` then
makes, at one listed shape, the calls the gate makes there."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from deltabench.correctness.engine import verify_case, warm_calls
from deltabench.correctness.plan import gate_shapes
from deltabench.harness import Case, get_impl


class _Recorder:
    """A registered impl that records (B, T, H, back-propagated?) of each call: the shape from its first
    argument, ``[B, T, H, ...]`` for every op here; a call back-propagates when any tensor argument needs a
    gradient. Everything else (name, backend, check_case, ...) is the impl's."""

    def __init__(self, op: str, name: str) -> None:
        self._impl = get_impl(op, name)
        self.calls: list[tuple[int, int, int, bool]] = []

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._impl, attr)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        B, T, H = args[0].shape[:3]
        self.calls.append((B, T, H, any(t.requires_grad for t in tensors)))
        return self._impl(*args, **kwargs)


def _listed(shapes: list[Case]) -> dict[tuple[int, int, int], bool]:
    return {(c.B, c.T, c.H): c.mode != "fwd" for c in shapes}


CASES = [  # (op, impl, case, reference, the oracle's limit); T odd: streaming halves of two lengths
    ("gdn", "torch_chunk", Case("gdn", 2, 131, 3, 8, 12, mode="fwd+bwd", seed=3), "torch_chunk", None),
    ("gdn", "torch_chunk", Case("gdn", 2, 131, 3, 8, 12, mode="fwd", seed=3), "torch_chunk", None),
    ("gdn", "torch_chunk", Case("gdn", 2, 131, 3, 8, 12, mode="fwd+bwd"), "torch_chunk", 2e4),  # reduced to H = 1
    ("gdn", "torch_chunk", Case("gdn", 1, 70, 2, 8, 12, mode="fwd+bwd"), "auto", None),  # the oracle at full shape
    ("sdm", "torch_chunk", Case("sdm", 1, 101, 2, 32, 8, 4, 3, mode="fwd+bwd"), "torch_chunk", None),
]
IDS = ["gdn-bwd", "gdn-fwd", "gdn-fewer-heads", "gdn-oracle", "sdm"]


@pytest.mark.parametrize(("op", "name", "case", "reference", "limit"), CASES, ids=IDS)
def test_gate_shapes_are_the_shapes_the_gate_calls(
    op: str, name: str, case: Case, reference: str, limit: float | None
) -> None:
    impl = _Recorder(op, name)
    kw = {"reference": reference, "oracle_max_elements": limit}
    report = verify_case(impl, case, seeds=1, extra_seed=False, **kw)
    assert report.passed, report.failures()
    called: dict[tuple[int, int, int], bool] = {}
    for B, T, H, back in impl.calls:
        called[(B, T, H)] = called.get((B, T, H), False) or back
    assert _listed(gate_shapes(impl, case, **kw)) == called


def test_warm_calls_make_the_gates_calls_at_a_shape() -> None:
    """At a listed shape: one call without an initial state and one with, each back-propagated in fwd+bwd."""
    impl = _Recorder("gdn", "torch_chunk")
    case = Case("gdn", 2, 150, 3, 8, 12, mode="fwd+bwd", seed=3)
    shapes: list[Case] = gate_shapes(impl, case, reference="torch_chunk")
    for shape in shapes:
        impl.calls.clear()
        warm_calls(impl, shape)
        back = shape.mode != "fwd"
        assert impl.calls == [(shape.B, shape.T, shape.H, back)] * 2, (shape.shape_id, impl.calls)
