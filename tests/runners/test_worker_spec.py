"""A queued job's spec as the workers expand it: suites filtered, ad-hoc cases, fixed run and job ids."""

from __future__ import annotations

import datetime as dt

import pytest

from deltabench.fleet.worker import device_for_kind, queued_run_id, stable_job_id, suite_for_spec
from deltabench.harness.errors import BadInput


def _cases(suite, **filters):  # type: ignore[no-untyped-def]
    return [(c.op, impl, c.shape_id, c.dtype, c.mode) for c, impl in suite.jobs(device="cpu", **filters)]


def test_a_suite_is_filtered_by_dtypes_modes_and_shapes() -> None:
    spec = {"suite": "smoke", "ops": [], "impls": [], "shapes": [], "dtypes": ["fp32"], "modes": ["fwd"]}
    suite = suite_for_spec(spec)
    cases = _cases(suite, ops=["kda"])
    assert cases == [
        ("kda", "torch_recurrent", "B1-T72-H2-K16-V32", "fp32", "fwd"),
        ("kda", "torch_chunk", "B1-T72-H2-K16-V32", "fp32", "fwd"),
    ]
    assert suite.timing["budget_s"] == 0.1, "the suite's own settings are kept"
    same_shape = suite_for_spec({**spec, "shapes": ["B=1,T=72,H=2,K=16,V=32"]})
    assert _cases(same_shape) == _cases(suite)
    with pytest.raises(BadInput, match="no case"):
        suite_for_spec({**spec, "shapes": ["B=1,T=73,H=2,K=16,V=32"]})


def test_cases_without_a_suite_use_the_named_impls_or_every_registered_one() -> None:
    spec = {"suite": None, "ops": ["gdn", "kda"], "impls": ["torch_chunk"], "shapes": ["B=1,T=20,H=1,K=8,V=4"]}
    cases = _cases(suite_for_spec(spec))
    assert cases == [
        ("gdn", "torch_chunk", "B1-T20-H1-K8-V4", "bf16", "fwd"),
        ("kda", "torch_chunk", "B1-T20-H1-K8-V4", "bf16", "fwd"),
    ], "a suite's defaults (bf16, fwd) when dtypes and modes are empty"
    every = suite_for_spec({**spec, "impls": [], "ops": ["kda"], "dtypes": ["fp32"], "modes": ["fwd+bwd"]})
    impls = {impl for _, impl, *_ in _cases(every)}
    assert {"torch_recurrent", "torch_chunk"} <= impls
    assert every.baselines == {"kda": "torch_recurrent"}
    with pytest.raises(BadInput, match="needs ops and shapes"):
        suite_for_spec({"suite": None, "ops": ["gdn"], "shapes": []})
    with pytest.raises(BadInput, match="none of the impls"):
        suite_for_spec({**spec, "impls": ["no_such_impl"]})


def test_run_and_job_ids_are_fixed_by_the_queued_job() -> None:
    created = dt.datetime(2026, 11, 1, 12, 0, tzinfo=dt.timezone.utc)
    run = queued_run_id(7, created)
    assert run == queued_run_id(7, created.replace(tzinfo=None)), "SQLite hands back naive times"
    assert run.startswith("job7-") and run != queued_run_id(7, created + dt.timedelta(seconds=1))
    assert run != queued_run_id(8, created)
    case = {"op": "gdn", "B": 1, "T": 20, "H": 1, "K": 8, "V": 4, "dtype": "fp32", "mode": "fwd"}
    job = stable_job_id(run, case, "torch_chunk")
    assert job == stable_job_id(run, dict(reversed(case.items())), "torch_chunk")
    assert job != stable_job_id(run, case, "torch_recurrent")
    assert job != stable_job_id(run, {**case, "T": 21}, "torch_chunk")
    assert len(job) <= 128, "fits the results table's job_id column"


@pytest.mark.parametrize(
    ("kind", "device"),
    [("cpu", "cpu"), ("h200", "cuda"), ("cuda", "cuda"), ("a100", "cuda"), ("tpu-v5e", "tpu"), ("TPU", "tpu")],
)
def test_device_kinds_map_to_runner_devices(kind: str, device: str) -> None:
    assert device_for_kind(kind) == device


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--queue", "cpu", "--server", "http://127.0.0.1:1", "--broker", "redis://127.0.0.1:6379/13"], "--token"),
        (["--queue", "cpu", "--server", "http://127.0.0.1:1", "--token", "t"], "--broker"),
        (["--queue", "cpu", "--server", "127.0.0.1:1", "--token", "t", "--broker", "redis://x"], "http://"),
        (["--queue", "H200!", "--server", "http://x", "--token", "t", "--broker", "redis://x"], "device kind"),
        (["--queue", "cpu", "--server", "http://x", "--token", "t", "--broker", "redis://x", "-c", "0"], "at least 1"),
    ],
)
def test_worker_command_refuses_bad_options_with_one_line(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from deltabench.cli.app import main

    monkeypatch.delenv("DELTABENCH_TOKEN", raising=False)
    monkeypatch.delenv("DELTABENCH_BROKER", raising=False)
    with pytest.raises(SystemExit) as exited:
        main(["worker", *args])
    assert exited.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err
