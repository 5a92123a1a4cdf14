"""The compile stage's dry run (correctness/compile_ahead.py, kernels/common/jit_units.py): an impl's JIT kernels listed
without building any, each distinct one built once in a process of its own, side by side, and the calls themselves
where the dry run cannot stand in. The JIT library is a stand-in (jit_fake.py) whose builds leave files behind."""

from __future__ import annotations

import itertools
from pathlib import Path

import jit_fake
import pytest

from deltabench.correctness.compile_ahead import compile_ahead
from deltabench.harness import Case, get_impl
from deltabench.kernels.common import jit_units


@pytest.fixture
def jit_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("JIT_FAKE_DIR", str(tmp_path))
    monkeypatch.setenv("JIT_FAKE_BUILD_S", "0")
    monkeypatch.setitem(jit_units.FAMILIES, jit_fake.FAMILY.name, jit_fake.FAMILY)
    return tmp_path


def _impl(name: str, *, forward: jit_fake.Factory = jit_fake.forward, tag: str = "") -> object:
    """jit_fake's gdn impl, registered as `name` (jit_fake.register)."""
    jit_fake.register(name, forward=forward, tag=tag)
    return get_impl("gdn", name)


CASES = [
    Case("gdn", 1, 40, 2, 8, 12, mode="fwd+bwd"),
    Case("gdn", 2, 70, 2, 8, 12, mode="fwd+bwd"),  # the same kernels: only B and T differ
    Case("gdn", 1, 40, 3, 16, 8),  # new kernels, forward only
]


def test_a_dry_run_lists_each_kernel_once_and_builds_it_apart(jit_dir: Path) -> None:
    """Three shapes, two of them the same kernels: each distinct kernel is built once, not in this process (the dry
    run builds nothing; the worker processes do), and the gate's later calls find them all built."""
    import os

    line = compile_ahead(_impl("jit_listed"), CASES, workers=2)
    built = jit_fake.built(jit_dir)
    # K8-V12: forward without and with an initial state, one backward; K16-V8: forward only, both ways
    assert sorted(built) == [
        "backward-8-12",
        "forward-16-8-False",
        "forward-16-8-True",
        "forward-8-12-False",
        "forward-8-12-True",
    ]
    assert all(pid != os.getpid() for pid, _, _ in built.values())
    assert line.startswith("jit_fake dry run of 3 shapes: 5 of 5 kernels built, 2 at once, in "), line
    # the real calls now find every kernel: nothing is built again
    before = {name: path.stat().st_mtime_ns for name, path in ((p.name, p) for p in jit_dir.iterdir())}
    compile_ahead(_impl("jit_listed"), CASES[:1], workers=1)
    assert {p.name: p.stat().st_mtime_ns for p in jit_dir.iterdir()} == before


def test_the_kernels_are_built_side_by_side(jit_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Builds of 1.5 s each, two workers: two of them overlap in time (one after another they would not)."""
    monkeypatch.setenv("JIT_FAKE_BUILD_S", "1.5")
    compile_ahead(_impl("jit_overlap"), CASES[:1], workers=2)
    spans = sorted((t0, t1) for _, t0, t1 in jit_fake.built(jit_dir).values())
    assert len(spans) == 3
    assert any(b0 < a1 for (_, a1), (b0, _) in itertools.pairwise(spans)), spans


def test_a_dry_run_that_cannot_stand_in_falls_back_to_the_calls(jit_dir: Path) -> None:
    """An eager factory (its kernel runs at once) refuses the dry run: the calls are made here, one after another,
    and the line says why."""
    import os

    line = compile_ahead(_impl("jit_eager", forward=jit_fake.eager), CASES[:1])
    assert line.startswith("dry run failed (NotRecordable: eager is eager); 1 shapes called one after another"), line
    built = jit_fake.built(jit_dir)
    assert "eager-8-12-False" in built and all(pid == os.getpid() for pid, _, _ in built.values())


@pytest.mark.parametrize("how", ["fail", "die"])
def test_a_kernel_that_fails_to_build_is_named_not_raised(jit_dir: Path, how: str) -> None:
    """A build that raises, or a worker that dies mid-build: the compile stage still ends, naming the failure (the
    gate makes that call itself and judges it)."""
    line = compile_ahead(_impl(f"jit_{how}", tag=how), CASES[:1], workers=1)
    assert " kernels built, 1 at once, in " in line and " failed, first: " in line, line
    if how == "fail":
        assert "RuntimeError: forward cannot build (8, 12, False, 'fail')" in line, line
        assert "backward-8-12" in jit_fake.built(jit_dir)  # the others are built
    else:
        assert "BrokenProcessPool" in line, line


def test_an_unknown_family_is_named() -> None:
    with pytest.raises(ValueError, match="unknown JIT family 'nope': known ones are tilelang"):
        jit_units.family("nope")


def test_units_are_the_same_kernel_by_factory_and_arguments() -> None:
    a = jit_units.Unit("m", "f", (1, "bf16"), (("scale", 0.5),))
    assert jit_units.distinct([a, jit_units.Unit("m", "f", (1, "bf16"), (("scale", 0.5),)), a]) == [a]
    assert len(jit_units.distinct([a, jit_units.Unit("m", "f", (1, "bf16"), (("scale", 0.25),))])) == 2


def test_a_compile_job_builds_for_its_every_case_in_its_own_process(jit_dir: Path, tmp_path: Path) -> None:
    """A compile-stage job as a run hands it to a gate process (runners/session.compile_jobs: one for all the
    shapes of an impl listed by a dry run, JobSpec.compile_cases): ok, untimed, and its notes say what was built."""
    from deltabench.runners import isolated
    from deltabench.runners.base import JobSpec

    user = tmp_path / "user" / "jit_user.py"
    user.parent.mkdir()
    user.write_text(f"import sys\nsys.path.insert(0, {str(Path(__file__).parent)!r})\nimport jit_fake\n"
                    "jit_fake.register('jit_user')\n")  # fmt: skip
    job = JobSpec.for_case(
        CASES[0], "jit_user", imports=[str(user)], stage="compile", timeout_s=120, compile_cases=[CASES[2].to_dict()]
    )
    result = isolated.run_gates({0: job}, 1)[0]
    assert (result.status, result.timing, result.verification) == ("ok", None, []), result.reason
    assert result.notes.startswith("jit_fake dry run of 2 shapes: 5 of 5 kernels built"), result.notes
    assert len(jit_fake.built(jit_dir)) == 5
