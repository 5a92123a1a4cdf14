"""`deltabench run --gate-workers N` on the CPU with real processes and the real gate: every job gated first, N impls
at once, each impl's gates in a process of its own; then timed one at a time with its gate's outcome. Same statuses
and gate records as a run that gates job by job; a wrong impl `incorrect` and untimed; an impl that crashes in its
gate costs its own job only; no two timings overlap.
"""

from __future__ import annotations

import itertools
import re
import types
from pathlib import Path
from typing import Any

import pytest

from deltabench.cli.app import main
from deltabench.harness.cases import Case
from deltabench.harness.document import JobResult, ResultDocument
from deltabench.harness.registry import load_module
from deltabench.harness.suites import load_suite
from deltabench.runners.session import plan_run, run_plan

PLANTED = str(Path(__file__).with_name("planted_impls.py"))

SUITE = """
name = "pargate"
device = "cpu"
shapes = ["B=1,T=20,H=1,K=8,V=8", "B=1,T=24,H=1,K=8,V=8"]
dtypes = ["fp32"]
modes = ["fwd"]
timeout_s = 120
[timing]
budget_s = 0.05
min_reps = 3
warmup_s = 0.02
cpu_threads = 1
[gate]
seeds = 1
extra_seed = true
[ops.gdn]
impls = ["torch_chunk", "torch_recurrent", "planted_wrong", "planted_gate_crash"]
baseline = "torch_chunk"
"""


def _run(tmp: Path, workers: int) -> tuple[ResultDocument, list[tuple[int, int]], list[str]]:
    """The suite run with `workers` gate workers, what the gate phase reported (gated, total) and the phases the
    timing workers reported."""
    suite = tmp / "pargate.toml"
    suite.write_text(SUITE)
    load_module(PLANTED)
    plan = plan_run(load_suite(str(suite)), device="cpu", imports=[PLANTED], gate_workers=workers)
    progress: list[tuple[int, int]] = []
    phases: list[str] = []
    doc = run_plan(
        plan,
        out=tmp / f"out-{workers}.json",
        on_gated=lambda done, total, result: progress.append((done, total)),
        on_phase=lambda job, phase: phases.append(phase),
    )
    return doc, progress, phases


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, tuple]:
    """The suite run gated job by job (1) and two at a time (2)."""
    return {n: _run(tmp_path_factory.mktemp(f"gw{n}"), n) for n in (1, 2)}


class _FakeRunner:
    """Stands in for one impl's gate process in isolated.run_gates: `fn(job, env)` is each gate."""

    def __init__(self, fn, env) -> None:
        self.fn, self.env = fn, env

    def run(self, job):
        return self.fn(job, self.env)

    def close(self) -> None:
        pass

    def kill(self) -> None:
        pass


class _ImplJob:
    """A stand-in job for run_gates: its impl name, its case, and itself as its gate-stage copy."""

    stage = "all"

    def __init__(self, impl: str, **case: Any) -> None:
        self.impl = impl
        self.case = Case("gdn", **{"B": 1, "T": 64, "H": 2, "K": 8, "V": 8, **case})

    def model_copy(self, update: dict) -> _ImplJob:
        return self

    def to_case(self) -> Case:
        return self.case


def _fake_gates(monkeypatch: pytest.MonkeyPatch, fn) -> None:
    from deltabench.runners import isolated

    monkeypatch.setattr(isolated, "_gate_runner", lambda python, env: _FakeRunner(fn, env))


def _key(job: JobResult) -> tuple:
    return (job.impl, job.case.T)


def _gate(job: JobResult, drawn: int) -> list[tuple]:
    """A job's gate records as compared between runs: the run's drawn seed named as such (each run draws its own)."""
    return [
        (r.check, r.metric, r.regime, r.initial_state, "drawn" if r.seed == drawn else r.seed, r.passed, r.gating)
        for r in job.verification
    ]


def test_parallel_gates_give_the_statuses_and_records_of_serial_ones(runs) -> None:
    serial, parallel = runs[1][0], runs[2][0]
    assert [_key(j) for j in parallel.jobs] == [_key(j) for j in serial.jobs]
    assert {_key(j): j.status for j in parallel.jobs} == {_key(j): j.status for j in serial.jobs}
    assert [j.status for j in parallel.jobs if j.impl.startswith("torch")] == ["ok"] * 4
    sd, pd = serial.meta["gate_drawn_seed"], parallel.meta["gate_drawn_seed"]
    for s, p in zip(serial.jobs, parallel.jobs, strict=True):
        if s.status in ("ok", "incorrect"):
            assert p.verification and _gate(p, pd) == _gate(s, sd), _key(p)
            assert p.gate_reference == s.gate_reference
            # The checks at fixed seeds are the same computation: the same figures (the timing's integrity
            # records measure each run's own timed calls).
            fixed = [(r.check, r.seed, r.value) for r in s.verification if r.seed != sd and r not in s.integrity]
            assert [
                (r.check, r.seed, r.value) for r in p.verification if r.seed != pd and r not in p.integrity
            ] == fixed
    # Every gate of the run used its drawn seed.
    for j in parallel.jobs:
        if j.verification:
            assert pd in {r.seed for r in j.verification}
            gate = [r for r in j.verification if r not in j.integrity]  # the timing's integrity records follow
            assert gate[-1].check == "gate time"  # where the gate's seconds went, last of the gate's


def test_a_job_gated_first_keeps_every_record_of_its_timing(runs) -> None:
    """The timing process's records beside the gate's: its integrity records, and the GPU's state and a training
    step's mixer share, which a run gated first once dropped (only the integrity ones were kept)."""
    from deltabench.harness.document import CheckRecord
    from deltabench.runners.session import RunState

    gated = next(j for j in runs[2][0].jobs if j.status == "ok")
    gate = gated.model_copy(update={"verification": [r for r in gated.verification if r not in gated.integrity]})
    own = [
        CheckRecord(check=name, metric="m", value=1.0, threshold=None, passed=True, gating=False, detail="d")
        for name in ("integrity:clock", "hardware:clocks", "hardware:throttle", "mixer share")
    ]
    timed = gated.model_copy(update={"verification": own})
    job = types.SimpleNamespace(model_copy=lambda update: job)
    result = RunState._after_gate(gate, job, types.SimpleNamespace(run=lambda spec: timed))  # type: ignore[arg-type]
    assert result.verification == [*gate.verification, *own]


def test_the_gate_phase_reports_its_progress(runs) -> None:
    progress = runs[2][1]
    assert progress[0] == (0, 8) and progress[-1] == (8, 8)
    assert [d for d, _ in progress] == list(range(9))
    assert runs[1][1] == []  # gated job by job: no gate phase


def test_a_job_gated_first_is_not_gated_again(runs) -> None:
    assert runs[1][2].count("gate") == 8  # job by job: each job's worker gates it
    assert "gate" not in runs[2][2] and runs[2][2].count("timing") == 4  # gated first: the workers only time


def test_a_wrong_impl_is_incorrect_and_untimed(runs) -> None:
    doc = runs[2][0]
    for job in (j for j in doc.jobs if j.impl == "planted_wrong"):
        assert job.status == "incorrect" and job.timing is None
        assert job.reason.startswith("failed the gate: output")
        assert any(not r.passed for r in job.verification if r.gating)


def test_a_crash_in_a_gate_costs_its_own_job_only(runs) -> None:
    doc = runs[2][0]
    for job in doc.jobs:
        if job.impl == "planted_gate_crash":
            assert job.status == "failed" and job.timing is None
            assert job.reason.startswith("crashed in gate:") and "SIGSEGV" in job.reason, job.reason
        elif job.impl != "planted_wrong":
            assert job.status == "ok" and job.timing is not None and len(job.timing.samples_ms) >= 3
            assert all(r.passed for r in job.verification if r.gating)


def test_timings_never_overlap(runs) -> None:
    timed = sorted((j for j in runs[2][0].jobs if j.timing is not None), key=lambda j: j.started_at)
    assert len(timed) == 4
    for earlier, later in itertools.pairwise(timed):
        assert earlier.finished_at <= later.started_at, (_key(earlier), _key(later))


def test_repeat_gates_once_and_times_every_repetition(tmp_path: Path) -> None:
    suite = tmp_path / "pargate.toml"
    suite.write_text(SUITE.replace(', "planted_wrong", "planted_gate_crash"', "").replace("workers", "") + "")
    out = tmp_path / "out.json"
    argv = ["run", "--suite", str(suite), "--gate-workers", "2", "--repeat", "2", "--out", str(out), "--no-db", "-q"]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 0
    doc = ResultDocument.from_json(out.read_text())
    assert len(doc.jobs) == 4 and doc.meta["repeat"] == 2
    for job in doc.jobs:
        assert job.status == "ok" and job.verification
        assert job.timing.n_repetitions == 2


def test_the_suite_key_sets_the_workers_and_the_option_wins(tmp_path: Path) -> None:
    suite = tmp_path / "pargate.toml"
    suite.write_text(SUITE.replace("extra_seed = true", "extra_seed = true\nworkers = 3"))
    load_module(PLANTED)
    loaded = load_suite(str(suite))
    assert loaded.gate_workers == 3 and "workers" not in loaded.gate
    assert plan_run(loaded, device="cpu").gate_workers == 3
    assert plan_run(loaded, device="cpu", gate_workers=1).gate_workers == 1
    suite.write_text(SUITE.replace("extra_seed = true", "extra_seed = true\nworkers = 0"))
    with pytest.raises(Exception, match=r"\[gate\] workers"):
        load_suite(str(suite))


def test_a_hanging_gate_times_out_alone(tmp_path: Path) -> None:
    suite = tmp_path / "pargate.toml"
    text = SUITE.replace("timeout_s = 120", "timeout_s = 5").replace(
        '"planted_wrong", "planted_gate_crash"', '"planted_hang"'
    )
    suite.write_text(
        text.replace('shapes = ["B=1,T=20,H=1,K=8,V=8", "B=1,T=24,H=1,K=8,V=8"]', 'shapes = ["B=1,T=20,H=1,K=8,V=8"]')
    )
    load_module(PLANTED)
    plan = plan_run(load_suite(str(suite)), device="cpu", imports=[PLANTED], gate_workers=3)
    doc = run_plan(plan, out=tmp_path / "out.json")
    status = {j.impl: j.status for j in doc.jobs}
    assert status == {"torch_chunk": "ok", "torch_recurrent": "ok", "planted_hang": "timeout"}
    (hung,) = [j for j in doc.jobs if j.impl == "planted_hang"]
    assert hung.reason.startswith("no result after 5 s") and hung.timing is None


def test_gate_workers_out_of_range_or_with_base_ref_is_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    for extra in (["--gate-workers", "0"], ["--gate-workers", "2", "--base-ref", "HEAD"]):
        with pytest.raises(SystemExit) as exc:
            main(["run", "--suite", "smoke", "--no-db", *extra])
        assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--gate-workers 0: use at least 1" in err and "--gate-workers with --base-ref" in err


@pytest.mark.parametrize(("workers", "share"), [(1, None), (4, "0.25")])
def test_gates_side_by_side_are_told_their_share_of_the_device(
    workers: int, share: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from deltabench.harness.devices import DEVICE_SHARE_ENV
    from deltabench.runners import isolated

    seen: list[str | None] = []

    def fake_gate(job, env):  # records the environment each gate would get
        seen.append((env or {}).get(DEVICE_SHARE_ENV))
        return JobResult.model_construct(status="ok")

    _fake_gates(monkeypatch, fake_gate)
    isolated.run_gates({k: _ImplJob(f"impl{k % 4}") for k in range(8)}, workers, python="python3", env={"X": "1"})
    assert seen == [share] * 8
    # the share is of the chains side by side: three impls of one gate each under four workers get a third each
    seen.clear()
    isolated.run_gates({k: _ImplJob(f"impl{k}") for k in range(3)}, workers, python="python3")
    assert seen == [None if workers == 1 else "0.333333"] * 3


def test_places_left_empty_are_filled_by_splitting_an_impls_chain() -> None:
    """Fewer impls than workers: the longest chain is halved, gates that share reduced cases (dims but B and T,
    dtype, mode) kept together, until the places are filled or every chain holds one gate; compiles stay alone."""
    from deltabench.runners.isolated import _split_chains

    jobs = {
        0: _ImplJob("a", T=64), 1: _ImplJob("a", T=128), 2: _ImplJob("a", K=16, V=16),  # 0 and 1: one family
        3: _ImplJob("a", mode="fwd+bwd"), 4: _ImplJob("b"), 5: _ImplJob("b", H=4),
    }  # fmt: skip
    a, b = [0, 1, 2, 3], [4, 5]
    assert _split_chains([a, b], jobs, 1) == [a, b]  # never joined, never split when places are full
    assert _split_chains([a, b], jobs, 2) == [a, b]
    three = _split_chains([a, b], jobs, 3)
    assert sorted(map(sorted, three)) == [[0, 1], [2, 3], [4, 5]]  # the family {0, 1} stays whole
    assert sorted(map(sorted, _split_chains([a, b], jobs, 4))) == [[0, 1], [2, 3], [4], [5]]  # families first
    assert sorted(map(sorted, _split_chains([a, b], jobs, 9))) == [[0], [1], [2], [3], [4], [5]]
    # an impl that autotunes is split only between tuning groups (dims but B and T, dtype; not the mode): b's two H
    # apart, and a forward gate stays with the forward+backward one of its dims, which tunes its kernels first
    assert sorted(map(sorted, _split_chains([a, b], jobs, 9, autotuned={4, 5}))) == [[0], [1], [2], [3], [4], [5]]
    tuned = {
        7: _ImplJob("f", mode="fwd+bwd"), 8: _ImplJob("f", mode="fwd+bwd", H=4),
        9: _ImplJob("f"), 10: _ImplJob("f", H=4), 11: _ImplJob("f", T=512),
    }  # fmt: skip
    f = [7, 8, 9, 10, 11]
    assert sorted(map(sorted, _split_chains([f], tuned, 9, autotuned=set(f)))) == [[7, 9, 11], [8, 10]]
    assert _split_chains([[7, 9, 11]], tuned, 9, autotuned=set(f)) == [[7, 9, 11]]
    compile_job = _ImplJob("c")
    compile_job.stage = "compile"
    assert _split_chains([[6]], {6: compile_job}, 4) == [[6]]


def test_gates_side_by_side_hold_jax_to_their_share_unless_the_user_set_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from deltabench.runners import isolated

    envs: list[dict] = []

    def fake_gate(job, env):
        envs.append(dict(env or {}))
        return JobResult.model_construct(status="ok")

    _fake_gates(monkeypatch, fake_gate)
    four = {k: _ImplJob(f"impl{k}") for k in range(4)}
    monkeypatch.delenv("XLA_CLIENT_MEM_FRACTION", raising=False)
    monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)
    isolated.run_gates(four, 4, python="python3")
    assert envs[-1]["XLA_CLIENT_MEM_FRACTION"] == "0.25"
    # JAX refuses both names at once: a fraction the user set under either is left alone
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.5")
    isolated.run_gates(four, 4, python="python3")
    assert "XLA_CLIENT_MEM_FRACTION" not in envs[-1]
    isolated.run_gates(four, 1, python="python3")
    assert "XLA_CLIENT_MEM_FRACTION" not in envs[-1]


def test_gates_give_jax_buffers_back_unless_the_user_chose_an_allocator(monkeypatch: pytest.MonkeyPatch) -> None:
    """A gate alone or beside others runs JAX on its platform allocator (a JAX impl's pool would starve the float32
    reference of the same gate: jax_chunk's fwd+bwd gate at B4-T8192-H16 on the H200) and PyTorch on expandable
    segments (its cache stranded 26.5 GiB in that gate); the user's choice of either stays, by either of PyTorch's
    names."""
    from deltabench.runners import isolated

    envs: list[dict] = []

    def fake_gate(job, env):
        envs.append(dict(env or {}))
        return JobResult.model_construct(status="ok")

    _fake_gates(monkeypatch, fake_gate)
    for name in ("XLA_PYTHON_CLIENT_ALLOCATOR", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        monkeypatch.delenv(name, raising=False)
    for workers in (1, 4):
        isolated.run_gates({k: _ImplJob(f"impl{k}") for k in range(4)}, workers, python="python3")
        assert envs[-1]["XLA_PYTHON_CLIENT_ALLOCATOR"] == "platform"
        assert envs[-1]["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    isolated.run_gates({0: _ImplJob("impl0")}, 1, python="python3", env={"XLA_PYTHON_CLIENT_ALLOCATOR": "bfc"})
    assert envs[-1]["XLA_PYTHON_CLIENT_ALLOCATOR"] == "bfc"
    for name in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        isolated.run_gates({0: _ImplJob("impl0")}, 1, python="python3", env={name: "max_split_size_mb:512"})
        assert envs[-1][name] == "max_split_size_mb:512"
        assert {"PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"} & set(envs[-1]) == {name}


def test_a_process_sharing_a_gpu_holds_its_allocator_to_its_share(monkeypatch: pytest.MonkeyPatch) -> None:
    # No GPU here: what is checked is the call torch would get (set_per_process_memory_fraction), and that no
    # other device or share gets one.
    import torch

    from deltabench.harness.devices import DEVICE_SHARE_ENV, keep_to_share

    calls: list[tuple[float, int]] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, d=None: calls.append((f, d)))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: types.SimpleNamespace(total_memory=64 * 2**30))
    monkeypatch.setenv(DEVICE_SHARE_ENV, "0.125")
    # 8 GiB of a 64 GiB device, less the 2 GiB a process holds outside its allocator
    assert keep_to_share("cuda:1") == 0.09375 and calls == [(0.09375, 1)]
    assert keep_to_share("cpu") == 1.0 and keep_to_share("tpu") == 1.0 and len(calls) == 1
    monkeypatch.delenv(DEVICE_SHARE_ENV)
    assert keep_to_share("cuda") == 1.0 and len(calls) == 1


def test_device_share_reads_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    from deltabench.harness.devices import DEVICE_SHARE_ENV, device_share
    from deltabench.harness.errors import BadInput

    monkeypatch.delenv(DEVICE_SHARE_ENV, raising=False)
    assert device_share() == 1.0
    monkeypatch.setenv(DEVICE_SHARE_ENV, "0.25")
    assert device_share() == 0.25
    for bad in ("0", "1.5", "half"):
        monkeypatch.setenv(DEVICE_SHARE_ENV, bad)
        with pytest.raises(BadInput, match=DEVICE_SHARE_ENV):
            device_share()


class _GateJob(_ImplJob):
    """A job as run_gates sees it: an impl, a key and a case (forward only unless told)."""

    def __init__(self, impl: str, key: int, **case: Any) -> None:
        super().__init__(impl, **case)
        self.key = key


def _recorded_gates(monkeypatch: pytest.MonkeyPatch, order: list[str], workers: int, own_process=()) -> list[tuple]:
    """run_gates over fake gates of the impls in `order` (one job each, keyed by position), each sleeping a moment:
    the (start | end, impl, key) events in the order they happened."""
    import threading
    import time

    from deltabench.runners import isolated

    lock = threading.Lock()
    events: list[tuple[str, str, int]] = []

    def fake_gate(job, env):
        with lock:
            events.append(("start", job.impl, job.key))
        time.sleep(0.1)
        with lock:
            events.append(("end", job.impl, job.key))
        return JobResult.model_construct(status="ok")

    _fake_gates(monkeypatch, fake_gate)
    jobs = {k: _GateJob(impl, k) for k, impl in enumerate(order)}
    results = isolated.run_gates(jobs, workers, python="python3", own_process=own_process)
    assert sorted(results) == list(range(len(order)))
    return events


def test_an_impls_gates_run_one_after_another_beside_other_impls(monkeypatch: pytest.MonkeyPatch) -> None:
    # one process per impl (its compiles and the gate's reduced-case records made once): an impl's gates never
    # overlap and keep their order, while other impls' gates run beside them (as many workers as impls: no place
    # is left to fill by splitting a chain)
    order = ["a", "b", "a", "c", "b", "a", "c"]
    events = _recorded_gates(monkeypatch, order, 3)
    for impl in "abc":
        mine = [(what, key) for what, i, key in events if i == impl]
        keys = [k for k, i in enumerate(order) if i == impl]
        assert mine == [(what, k) for k in keys for what in ("start", "end")], mine
    running, most = 0, 0
    for what, _, _ in events:
        running += 1 if what == "start" else -1
        most = max(most, running)
    assert most == 3  # the three impls side by side


def test_an_impls_gates_with_a_backward_go_first(monkeypatch: pytest.MonkeyPatch) -> None:
    # their calls compile and autotune the forward's kernels too, which the forward-only gates after find done
    from deltabench.runners import isolated

    seen: list[int] = []

    def fake_gate(job, env):
        seen.append(job.key)
        return JobResult.model_construct(status="ok")

    _fake_gates(monkeypatch, fake_gate)
    modes = ["fwd", "fwd+bwd", "fwd", "fwd+bwd", "bwd"]
    jobs = {k: _GateJob("a", k, mode=mode, T=64 + k) for k, mode in enumerate(modes)}
    isolated.run_gates(jobs, 1, python="python3")
    assert seen == [1, 3, 4, 0, 2]  # the others in the order given


def test_an_impl_that_compiles_per_shape_gates_its_jobs_side_by_side(monkeypatch: pytest.MonkeyPatch) -> None:
    # each job of such an impl (own_process) is a chain of its own, so its compiles overlap; the other impls keep
    # one chain each (five workers: one place a chain)
    events = _recorded_gates(monkeypatch, ["a", "b", "a", "c", "b", "a", "c"], 5, own_process={0, 2, 5})
    running: dict[str, int] = {"a": 0, "b": 0, "c": 0}
    most = dict(running)
    for what, impl, _ in events:
        running[impl] += 1 if what == "start" else -1
        most[impl] = max(most[impl], running[impl])
    assert most == {"a": 3, "b": 1, "c": 1}


def test_the_gate_phase_gives_each_job_of_an_impl_that_compiles_per_shape_a_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from deltabench.harness.registry import get_impl, register_impl
    from deltabench.runners import isolated

    chunk = get_impl("gdn", "torch_chunk")
    register_impl(
        "gdn", "planted_compiles", backend="torch", devices=("cpu",), dtypes=("fp32",), compiles_per_shape=True
    )(chunk.fn)
    register_impl("gdn", "planted_autotunes", backend="torch", devices=("cpu",), dtypes=("fp32",), autotunes=True)(
        chunk.fn
    )
    seen: dict[str, object] = {}

    def fake_run_gates(
        todo, workers, *, python=None, env=None, on_gated=None, own_process=(), after_compiles=(), autotuned=(), **_
    ):
        seen["own"] = sorted(todo[k].impl for k in own_process)
        seen["whole"] = sorted(todo[k].impl for k in autotuned)
        seen["all"] = sorted(j.impl for j in todo.values())
        return {}

    monkeypatch.setattr(isolated, "run_gates", fake_run_gates)
    suite = tmp_path / "pargate.toml"
    suite.write_text(SUITE.replace('"planted_wrong", "planted_gate_crash"', '"planted_compiles", "planted_autotunes"'))
    plan = plan_run(load_suite(str(suite)), device="cpu", gate_workers=3)
    from deltabench.runners.environment import collect_environment
    from deltabench.runners.session import RunState, execution_order

    RunState(plan, collect_environment("cpu"), tmp_path / "o.json", None).gate_all(execution_order(plan), 3)
    assert seen["own"] == ["planted_compiles"] * 2
    assert seen["whole"] == ["planted_autotunes"] * 2  # an impl that autotunes keeps one process
    impls = ["planted_compiles", "planted_autotunes", "torch_chunk", "torch_recurrent"]
    assert seen["all"] == sorted(impls * 2)


def test_flas_impls_are_declared_to_autotune() -> None:
    from deltabench.kernels.external.fla import IMPLS

    assert IMPLS and all(d.autotunes for d in IMPLS)


def test_a_gate_out_of_memory_beside_others_runs_again_alone(tmp_path: Path) -> None:
    # planted_oom_when_shared runs out of memory only while DELTABENCH_DEVICE_SHARE < 1: beside another gate. Run
    # again alone after the others, it passes and is timed; a gate that runs out of memory alone too stays oom.
    suite = tmp_path / "oom.toml"
    suite.write_text(SUITE.replace('"planted_wrong", "planted_gate_crash"', '"planted_oom_when_shared"'))
    load_module(PLANTED)
    for workers, status in ((2, "ok"), (1, "ok")):
        heard: list[tuple[int, str]] = []  # (jobs gated, the reason) of each gate put back: not yet counted

        def on_gated(done: int, total: int, result: JobResult | None, heard: list = heard) -> None:
            if result is not None and result.status == "oom":
                heard.append((done, result.reason))

        plan = plan_run(load_suite(str(suite)), device="cpu", imports=[PLANTED], gate_workers=workers)
        doc = run_plan(plan, out=tmp_path / f"oom-{workers}.json", on_gated=on_gated if workers > 1 else None)
        planted = [j for j in doc.jobs if j.impl == "planted_oom_when_shared"]
        assert [j.status for j in planted] == [status, status], [j.reason for j in planted]
        assert all(j.timing is not None for j in planted)
        if workers > 1:  # each said as it was put back, where a log would otherwise show nothing of it
            assert len(heard) == 2 and all("beside other gates: again alone once they end" in r for _, r in heard)
            # first, where a progress line cut at 160 characters keeps them: the device full, or the process at its own
            figures = "tried 20.00 MiB, 323.06 MiB free, of 139.80 GiB, this process held 27.46 GiB"
            assert all(figures in r[:160] for _, r in heard), heard


def test_oom_figures_read_torchs_message_and_nothing_else() -> None:
    from deltabench.harness.errors import oom_figures

    assert (
        oom_figures(
            "CUDA out of memory. Tried to allocate 5.00 GiB. GPU 0 has a total capacity of 139.80 GiB of "
            "which 1.02 GiB is free."
        )
        == "tried 5.00 GiB, 1.02 GiB free, of 139.80 GiB"
    )
    assert oom_figures("RESOURCE_EXHAUSTED: out of memory while trying to allocate") == ""


def test_the_alone_rerun_waits_for_the_others_and_has_the_whole_device(monkeypatch: pytest.MonkeyPatch) -> None:
    import threading
    import time

    from deltabench.harness.devices import DEVICE_SHARE_ENV
    from deltabench.runners import isolated

    lock = threading.Lock()
    running: set[int] = set()
    calls: list[tuple[int, str | None, frozenset[int]]] = []

    class Job(_GateJob):
        def __init__(self, key: int) -> None:
            super().__init__(f"impl{key}", key)

    def fake_gate(job, env):
        share = (env or {}).get(DEVICE_SHARE_ENV)
        with lock:
            calls.append((job.key, share, frozenset(running)))
            running.add(job.key)
        time.sleep(0.05)
        with lock:
            running.discard(job.key)
        oom = job.key == 2 or (job.key == 1 and share is not None)  # job 2 runs out of memory alone too
        return JobResult.model_construct(status="oom" if oom else "ok")

    _fake_gates(monkeypatch, fake_gate)
    seen: list[int] = []
    results = isolated.run_gates(
        {k: Job(k) for k in range(4)}, 4, python="python3", on_gated=lambda k, r: seen.append(k)
    )
    assert {k: r.status for k, r in results.items()} == {0: "ok", 1: "ok", 2: "oom", 3: "ok"}
    alone = sorted((key, share, others) for key, share, others in calls if share is None)
    # each alone, after every other gate ended (in the order they ran out, which the threads decide)
    assert alone == [(1, None, frozenset()), (2, None, frozenset())]
    assert sorted(seen) == [0, 1, 2, 3] and len(seen) == 4  # each job reported once, with its final result


def test_a_gate_that_did_not_pass_is_saved_as_it_ends(tmp_path: Path) -> None:
    # a run cut during its gate phase keeps the verdicts already reached (the timings come after every gate)
    suite = tmp_path / "pargate.toml"
    suite.write_text(SUITE.replace('"planted_wrong", "planted_gate_crash"', '"planted_wrong"'))
    load_module(PLANTED)
    plan = plan_run(load_suite(str(suite)), device="cpu", imports=[PLANTED], gate_workers=2)
    out = tmp_path / "out.json"
    on_disk: list[list[tuple[str, str]]] = []

    def gated(done: int, total: int, result: object) -> None:
        if done == total:  # the gate phase's end: nothing timed yet
            saved = ResultDocument.model_validate_json(out.read_text())
            on_disk.append([(j.impl, j.status) for j in saved.jobs])

    doc = run_plan(plan, out=out, on_gated=gated)
    assert on_disk == [[("planted_wrong", "incorrect")] * 2]
    assert sorted((j.impl, j.status) for j in doc.jobs) == sorted(
        [("planted_wrong", "incorrect")] * 2 + [("torch_chunk", "ok")] * 2 + [("torch_recurrent", "ok")] * 2
    )


def test_a_logged_run_prints_a_line_per_gate_and_per_job(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # stdout not a terminal (a file, a pipe, CI): one timestamped line per gate and per job on stderr; none with -q
    suite = tmp_path / "pargate.toml"
    suite.write_text(SUITE.replace('"torch_recurrent", "planted_wrong", "planted_gate_crash"', '"planted_wrong"'))
    args = ["run", "--suite", str(suite), "--import", PLANTED, "--no-db", "--out", str(tmp_path / "o.json")]
    errs = []
    for extra in ([], ["--quiet"]):
        with pytest.raises(SystemExit) as exc:
            main([*args, "--gate-workers", "2", *extra])
        assert exc.value.code == 1  # planted_wrong is incorrect
        errs.append(capsys.readouterr().err)
    logged, quiet = errs
    at = r"^\s*\d+\.\d s  "
    assert re.search(at + r"gating 4 jobs first, up to 2 gate processes at once$", logged, re.M)
    assert re.search(at + r"gate \d/4 gdn torch_chunk B1-T20-H1-K8-V8 fp32 fwd: ok in \d+\.\d s$", logged, re.M)
    wrong = r"gate \d/4 gdn planted_wrong B1-T24-H1-K8-V8 fp32 fwd: incorrect in \d+\.\d s: failed the gate"
    assert re.search(at + wrong, logged, re.M)
    assert re.search(
        at + r"\[\d/4\] gdn torch_chunk B1-T24-H1-K8-V8 fp32 fwd: ok, median [\d.e-]+ ms in ", logged, re.M
    )
    assert re.search(at + r"\[\d/4\] gdn planted_wrong B1-T20-H1-K8-V8 fp32 fwd: incorrect", logged, re.M)
    assert "gating" not in quiet and "gate 1/4" not in quiet and "[1/4]" not in quiet


def test_compile_jobs_are_one_per_impl_and_shape_of_the_gates() -> None:
    """The compiles before the gates of an impl that compiles each shape: one job per shape its gates call
    (correctness.plan.gate_shapes), back-propagating where any of those gates does; none for a CPU job."""
    from deltabench.correctness.plan import gate_shapes
    from deltabench.harness import Case, get_impl
    from deltabench.runners.base import JobSpec
    from deltabench.runners.session import compile_jobs

    fwd, both = (Case("gdn", 2, 131, 3, 8, 12, mode=m, device="cuda") for m in ("fwd", "fwd+bwd"))
    jobs = [JobSpec.for_case(c, "torch_chunk", gate={"reference": "torch_chunk"}) for c in (fwd, both)]
    made = compile_jobs(jobs)
    listed = gate_shapes(get_impl("gdn", "torch_chunk"), both, reference="torch_chunk")
    assert sorted(made) == list(range(len(made))) and all(j.stage == "compile" for j in made.values())
    assert sorted((j.to_case().shape_id, j.to_case().mode) for j in made.values()) == sorted(
        (c.shape_id, c.mode) for c in listed
    )
    assert any(c.mode == "fwd+bwd" for c in listed)  # the fwd job lists the same shapes, each "fwd": merged away
    assert compile_jobs([JobSpec.for_case(both.replace(device="cpu"), "torch_chunk")]) == {}


def test_compile_jobs_of_an_impl_a_dry_run_lists_are_one_job_for_all_its_shapes() -> None:
    """An impl whose kernels a dry run lists (Impl.jit): one compile job for every shape of its gates (its case and
    compile_cases), the kernels of which it builds side by side; another impl keeps one job per shape."""
    from deltabench.correctness.plan import gate_shapes
    from deltabench.harness import Case, get_impl
    from deltabench.harness.registry import register_impl
    from deltabench.runners.base import JobSpec
    from deltabench.runners.session import compile_jobs

    chunk = get_impl("gdn", "torch_chunk")
    register_impl(
        "gdn", "planted_jit", backend="torch", devices=("cpu", "cuda"), dtypes=("fp32",), compiles_per_shape=True,
        jit="tilelang",
    )(chunk.fn)  # fmt: skip
    fwd, both = (Case("gdn", 2, 131, 3, 8, 12, mode=m, device="cuda") for m in ("fwd", "fwd+bwd"))
    other = Case("gdn", 1, 64, 4, 16, 16, mode="fwd+bwd", device="cuda")
    gate = {"reference": "torch_chunk"}
    jobs = [JobSpec.for_case(c, impl, gate=gate) for impl in ("planted_jit", "torch_chunk") for c in (fwd, both, other)]
    made = list(compile_jobs(jobs).values())
    (jit_job,) = [j for j in made if j.impl == "planted_jit"]
    listed = {
        (c.shape_id, c.mode)
        for case in (both, other)
        for c in gate_shapes(get_impl("gdn", "planted_jit"), case, reference="torch_chunk")
    }
    cases = [jit_job.to_case(), *(Case(**c) for c in jit_job.compile_cases)]
    assert sorted((c.shape_id, c.mode) for c in cases) == sorted(listed)
    assert len([j for j in made if j.impl == "torch_chunk"]) == len(listed)
    assert all(not j.compile_cases for j in made if j.impl == "torch_chunk")


def test_a_compile_job_makes_the_gates_calls_and_ends_ok_untimed() -> None:
    """A compile-stage job in a gate process (run_gates runs a job of that stage as such): ok, with no timing and no
    gate records (its calls are unchecked; the gate makes them again, checked)."""
    from deltabench.harness import Case
    from deltabench.runners import isolated
    from deltabench.runners.base import JobSpec

    case = Case("gdn", 1, 70, 2, 8, 12, mode="fwd+bwd")
    job = JobSpec.for_case(case, "torch_chunk", timeout_s=120, stage="compile")
    result = isolated.run_gates({0: job}, 1)[0]
    assert (result.status, result.timing, result.verification) == ("ok", None, []), result.reason


def test_compiles_run_beside_the_other_gates_and_before_their_impls_gates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With shapes to compile (a GPU run; here compile_jobs is made to list some for the CPU jobs), the gate phase
    hands run_gates the compiles, each a chain of its own, with every gate, and the compiling impl's gates to start
    after the compiles; on_compiled follows the compiles, on_gated the gates alone."""
    from deltabench.harness.registry import get_impl, register_impl
    from deltabench.runners import isolated, session

    chunk = get_impl("gdn", "torch_chunk")
    register_impl(
        "gdn", "planted_compiles", backend="torch", devices=("cpu",), dtypes=("fp32",), compiles_per_shape=True
    )(chunk.fn)
    calls: list[dict] = []

    def fake_run_gates(
        todo, workers, *, python=None, env=None, on_gated=None, own_process=(), after_compiles=(), autotuned=(), **_
    ):
        calls.append({"jobs": {k: (j.impl, j.stage) for k, j in todo.items()}, "own": set(own_process)})
        calls[-1]["after"] = set(after_compiles)
        for key, job in todo.items():
            on_gated(key, JobResult.model_construct(status="ok", impl=job.impl))
        return {}

    def fake_compile_jobs(jobs):
        return {k: j.model_copy(update={"stage": "compile"}) for k, j in enumerate(jobs * 3)}

    monkeypatch.setattr(isolated, "run_gates", fake_run_gates)
    monkeypatch.setattr(session, "compile_jobs", fake_compile_jobs)
    suite = tmp_path / "pargate.toml"
    suite.write_text(SUITE.replace('"planted_wrong", "planted_gate_crash"', '"planted_compiles"'))
    plan = plan_run(load_suite(str(suite)), device="cpu", gate_workers=3)
    from deltabench.runners.environment import collect_environment

    compiled: list[tuple[int, int]] = []
    state = session.RunState(plan, collect_environment("cpu"), tmp_path / "o.json", None)
    state.gate_all(session.execution_order(plan), 3, on_compiled=lambda d, t, r: compiled.append((d, t)))
    (call,) = calls
    compiles = {k for k, (_, stage) in call["jobs"].items() if stage == "compile"}
    mine = {k for k, (impl, stage) in call["jobs"].items() if impl == "planted_compiles" and stage != "compile"}
    assert len(compiles) == 6 and all(k < 0 for k in compiles) and len(mine) == 2
    assert call["own"] == compiles | mine and call["after"] == mine
    assert compiled == [(n, 6) for n in range(7)]
    assert sorted(state.gated) == sorted(k for k in call["jobs"] if k >= 0)  # the gates' outcomes, no compile's


def test_gates_after_compiles_start_once_every_compile_ended(monkeypatch: pytest.MonkeyPatch) -> None:
    """run_gates with compile-stage jobs: the other impls' gate chains take their places first, the compiles run
    beside them, and the chains in after_compiles start only when the last compile has ended."""
    import threading
    import time

    from deltabench.runners import isolated

    lock = threading.Lock()
    events: list[tuple[str, int]] = []

    class Job(_GateJob):
        def __init__(self, impl: str, key: int, stage: str = "all") -> None:
            super().__init__(impl, key)
            self.stage = stage

    def fake_gate(job, env):
        with lock:
            events.append(("start", job.key))
        time.sleep(0.05 if job.stage == "compile" else 0.1)
        with lock:
            events.append(("end", job.key))
        return JobResult.model_construct(status="ok")

    _fake_gates(monkeypatch, fake_gate)
    jobs = {0: Job("fla", 0), 1: Job("fla", 1), 2: Job("qla", 2), 3: Job("qla", 3)}
    jobs.update({-1 - k: Job("qla", -1 - k, "compile") for k in range(5)})
    own = {2, 3, *range(-5, 0)}
    isolated.run_gates(jobs, 3, python="python3", own_process=own, after_compiles={2, 3})
    starts = {k: events.index(("start", k)) for k in jobs}
    ends = {k: events.index(("end", k)) for k in jobs}
    last_compile = max(ends[k] for k in range(-5, 0))
    assert min(starts[2], starts[3]) > last_compile  # qla's gates after every compile
    assert starts[0] < min(starts[k] for k in range(-5, 0))  # fla's chain took its place first
    assert starts[0] < last_compile  # and ran beside the compiles


def test_shares_side_by_side_leave_room_outside_the_allocators() -> None:
    # Five gates on an H200 each held to a fifth filled the device: their CUDA contexts and kernels came on top.
    from deltabench.harness.devices import OUTSIDE_ALLOCATOR_BYTES, allocator_fraction

    total = 140 * 2**30
    for n in (2, 4, 5, 8):
        fraction = allocator_fraction(1 / n, total)
        assert n * (fraction * total + OUTSIDE_ALLOCATOR_BYTES) <= total
        assert fraction >= 1 / (2 * n)
    assert allocator_fraction(1.0, total) == 1.0  # the device alone: all of it
    assert allocator_fraction(0.01, total) == 0.005  # a sliver still gets half its share
