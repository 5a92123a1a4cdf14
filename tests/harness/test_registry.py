"""The impl registry: registration, lookup, availability reasons, user modules and lazy built-ins."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from deltabench.harness import BadInput, Case, UnknownImpl, UnknownOp, get_impl, impls_for, load_module, register_impl
from deltabench.harness import registry as _registry


@pytest.fixture
def cleanup() -> Iterator[list[tuple[str, str]]]:
    """Names registered by a test, removed afterwards so other tests see the built-in registry."""
    names: list[tuple[str, str]] = []
    yield names
    for key in names:
        _registry._REGISTRY.pop(key, None)


def test_register_and_get(cleanup: list[tuple[str, str]]) -> None:
    @register_impl("kda", "reg_test", backend="torch", devices=("cpu",), dtypes=("float32", "bfloat16"))
    def fn(q, k, v, g, beta, scale=None, initial_state=None):
        return v, None

    cleanup.append(("kda", "reg_test"))
    impl = get_impl("kda", "reg_test")
    assert impl.fn is fn and impl.dtypes == ("fp32", "bf16") and impl.backend == "torch"
    assert "reg_test" in [i.name for i in impls_for("kda")]
    assert impl.check_case(Case("kda", 1, 2, 1, 4, 4, dtype="fp16")) == "supports fp32, bf16, not fp16"
    assert impl.check_case(Case("kda", 1, 2, 1, 4, 4, dtype="fp32")) is None


def test_unknown_names_are_bad_input() -> None:
    with pytest.raises(UnknownOp, match=r"known ops: gdn, gdn2, gdn_layer, kda, lm_step, sdm"):
        get_impl("sdx", "x")
    with pytest.raises(UnknownImpl, match=r"registered impls are .*torch_chunk"):
        get_impl("gdn", "missing")
    with pytest.raises(BadInput, match="unknown backend"):
        register_impl("gdn", "x", backend="fortran", devices=("cpu",), dtypes=("fp32",))
    with pytest.raises(BadInput, match="impl 'x': unknown jit 'triton', expected one of tilelang"):
        register_impl("gdn", "x", backend="torch", devices=("cpu",), dtypes=("fp32",), jit="triton")


def test_reasons_for_unavailable_cases(cleanup: list[tuple[str, str]]) -> None:
    register_impl(
        "gdn", "reg_fwd_only", backend="torch", devices=("cuda",), dtypes=("fp32",), supports_backward=False,
        constraint=lambda c: "K must be 64" if c.K != 64 else None, requires=("no_such_package_xyz",),
    )(lambda *a, **k: None)  # fmt: skip
    cleanup.append(("gdn", "reg_fwd_only"))
    impl = get_impl("gdn", "reg_fwd_only")
    case = Case("gdn", 1, 2, 1, 8, 8, mode="fwd+bwd")
    assert impl.check_case(case) == "forward only (no backward)"
    assert "no_such_package_xyz" in impl.check_case(case.replace(mode="fwd"))
    impl.requires = ()
    assert impl.check_case(case.replace(mode="fwd")) == "runs on cuda, not cpu"
    impl.devices = ("cpu",)
    assert impl.check_case(case.replace(mode="fwd")) == "K must be 64"


def test_load_module_from_a_file_and_a_module(tmp_path: Path, cleanup: list[tuple[str, str]]) -> None:
    (tmp_path / "reg_user_mod.py").write_text(
        textwrap.dedent(
            """
            from deltabench.harness import register_impl

            @register_impl("gdn2", "reg_from_file", backend="torch", devices=("cpu",), dtypes=("fp32",))
            def f(q, k, v, g, b, w, scale=None, initial_state=None):
                return v, None
            """
        )
    )
    cleanup.append(("gdn2", "reg_from_file"))
    load_module(str(tmp_path / "reg_user_mod.py"))
    assert get_impl("gdn2", "reg_from_file").name == "reg_from_file"
    sys.path.insert(0, str(tmp_path))
    try:
        load_module("reg_user_mod")
    finally:
        sys.path.remove(str(tmp_path))
    with pytest.raises(BadInput, match="no such file"):
        load_module(str(tmp_path / "absent.py"))
    (tmp_path / "broken.py").write_text("raise RuntimeError('boom')\n")
    with pytest.raises(BadInput, match="RuntimeError: boom"):
        load_module(str(tmp_path / "broken.py"))
    with pytest.raises(BadInput, match="cannot import"):
        load_module("no_such_module_xyz")


def test_builtins_are_lazy_and_every_op_has_torch_references() -> None:
    for op in ("gdn", "gdn2", "kda"):
        names = {i.name for i in impls_for(op)}
        assert {"torch_recurrent", "torch_chunk"} <= names
        impl = get_impl(op, "torch_chunk")
        assert impl.source == "builtin"
        assert impl.fn.__deltabench_target__.endswith(f":{op}_torch_chunk")


def test_an_entry_point_of_the_deltabench_ops_group_registers_its_contract(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A package's ``deltabench.ops`` entry point naming a contract makes the op known (a broken one is reported)."""
    import dataclasses

    from deltabench.harness import ops
    from deltabench.references import gdn

    contract = dataclasses.replace(gdn.CONTRACT, name="plugged", title="A plug-in's op")

    class EntryPoint:
        def __init__(self, name: str, obj: object) -> None:
            self.name, self.obj = name, obj

        def load(self) -> object:
            if isinstance(self.obj, Exception):
                raise self.obj
            return self.obj

    points = [EntryPoint("plugged", contract), EntryPoint("broken", ImportError("no module named plugin"))]
    monkeypatch.setattr(ops, "entry_points", lambda group: points if group == "deltabench.ops" else [])
    monkeypatch.setattr(ops, "_ENTRY_POINTS_LOADED", False)
    try:
        assert ops.get_op("plugged") is contract
        assert Case("plugged", 1, 8, 1, 4).shape_id == "B1-T8-H1-K4-V4"
        with pytest.raises(UnknownOp, match="unknown op 'missing'"):
            ops.get_op("missing")
    finally:
        ops.OPS.pop("plugged", None)
        from deltabench.harness import document

        document._registered_ops.discard("plugged")
