"""correctness/memory_need.check_jobs_fit: the one host-memory check before any job starts, for `deltabench run`
(each job with its impl and gate reference) and for a job submitted to the service (no impl: the largest need)."""

from __future__ import annotations

import pytest

from deltabench.correctness.memory_need import check_jobs_fit, estimate_need
from deltabench.harness.cases import Case
from deltabench.harness.errors import BadInput

HUGE = Case("gdn", B=64, T=65536, H=32, K=128, V=128, dtype="fp32", mode="fwd+bwd")
TINY = Case("gdn", B=1, T=16, H=1, K=8, V=8, dtype="fp32", mode="fwd+bwd")


def test_the_first_job_that_cannot_fit_is_named() -> None:
    with pytest.raises(BadInput, match=r"^gdn/torch_chunk at B64-T65536-H32-K128-V128 fp32 fwd\+bwd on cpu needs at"):
        check_jobs_fit([(TINY, "torch_chunk", "auto"), (HUGE, "torch_chunk", "auto")])
    with pytest.raises(BadInput, match=r"^gdn B64-T65536-H32-K128-V128 fp32 fwd\+bwd on cpu needs at least"):
        check_jobs_fit([(HUGE, None, "auto")])  # a submitted job: no impl yet
    check_jobs_fit([(TINY, None, "auto"), (TINY, "torch_chunk", "auto")])


def test_gradients_count_only_where_the_impl_has_a_backward() -> None:
    """An impl unknown here counts as having a backward (a worker's --import), as a job without an impl does."""
    with_grads, without = estimate_need(HUGE, grads=True).total, estimate_need(HUGE, grads=False).total
    assert without < with_grads
    for impl in (None, "not_registered_here"):
        with pytest.raises(BadInput, match="needs at least"):
            check_jobs_fit([(HUGE, impl, "auto")])


def test_run_refuses_the_suite_before_its_first_job(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from deltabench.cli.app import main

    suite = tmp_path / "huge.toml"
    suite.write_text(
        'device = "cpu"\nshapes = ["B=64,T=65536,H=32,K=128,V=128"]\ndtypes = ["fp32"]\nmodes = ["fwd+bwd"]\n'
        '[ops.gdn]\nimpls = ["torch_chunk"]\n'
    )
    with pytest.raises(SystemExit) as stop:
        main(["run", "--suite", str(suite), "--no-db", "--out", str(tmp_path / "r.json"), "-q"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert "gdn/torch_chunk at B64-T65536-H32-K128-V128 fp32 fwd+bwd on cpu needs at least" in err
    assert not (tmp_path / "r.json").exists()
