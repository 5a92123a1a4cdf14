"""Documents as each runner writes them are stored whole on SQLite and on PostgreSQL.

PostgreSQL enforces column lengths that SQLite ignores: ``results.memory_method`` was ``VARCHAR(64)`` and the CPU
(87 characters) and JAX (93) runners' methods made PostgreSQL refuse every CPU- or JAX-timed result. The CPU and
JAX documents here are real: ``deltabench run`` on a tiny suite with a torch impl and a JAX impl on the CPU. The
CUDA one is built from the CUDA runner's own labels (this machine has no GPU).
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from deltabench.cli.app import main
from deltabench.db import queries
from deltabench.db.engine import session_scope
from deltabench.db.ingest import ingest_document
from deltabench.harness.document import MemoryStats, ResultDocument

SUITE = """
name = "runners"
device = "cpu"
shapes = ["B=1,T=20,H=1,K=8,V=8"]
dtypes = ["fp32"]
modes = ["fwd"]
timeout_s = 300
[timing]
budget_s = 0.05
min_reps = 3
warmup_s = 0.02
[gate]
seeds = 1
extra_seed = false
[ops.gdn]
impls = ["torch_chunk", "jax_chunk"]
baseline = "torch_chunk"
"""


@pytest.fixture(scope="module")
def cpu_and_jax_document(tmp_path_factory: pytest.TempPathFactory) -> ResultDocument:
    """A real run of a torch impl and a JAX impl on the CPU, as its document."""
    tmp = tmp_path_factory.mktemp("runners")
    suite, out = tmp / "runners.toml", tmp / "results.json"
    suite.write_text(SUITE)
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--suite", str(suite), "--out", str(out), "--no-db"])
    assert exit_info.value.code == 0
    return ResultDocument.from_json(out.read_text())


def cuda_document(factory) -> ResultDocument:  # type: ignore[no-untyped-def]
    """A document shaped as the CUDA runner writes it: CUDA events, the CUDA memory method, an H200."""
    from deltabench.runners.memory import CUDA_METHOD

    job = factory.job(impl="triton_chunk")
    job.timing.clock = "cuda_events"
    job.memory = MemoryStats(peak_bytes=1 << 30, inputs_bytes=1 << 20, method=CUDA_METHOD)
    return factory.document(jobs=[job], created_at=dt.datetime(2026, 2, 1, tzinfo=dt.timezone.utc))


def test_cpu_and_jax_documents_carry_long_memory_methods(cpu_and_jax_document: ResultDocument) -> None:
    from deltabench.runners.jax import XLA_MEMORY_METHOD
    from deltabench.runners.memory import HOST_RSS_METHOD

    methods = {j.impl: j.memory.method for j in cpu_and_jax_document.jobs if j.memory is not None}
    assert [j.status for j in cpu_and_jax_document.jobs] == ["ok", "ok"]
    assert methods == {"torch_chunk": HOST_RSS_METHOD, "jax_chunk": XLA_MEMORY_METHOD}
    assert min(len(m) for m in methods.values()) > 64  # what VARCHAR(64) refused


def test_every_runners_document_is_stored_whole(engine, factory, cpu_and_jax_document: ResultDocument) -> None:  # type: ignore[no-untyped-def]
    docs = [cpu_and_jax_document, cuda_document(factory)]
    with session_scope(engine) as s:
        for doc in docs:
            ingest_document(s, doc)
    with session_scope(engine) as s:
        for doc in docs:
            assert queries.load_run_document(s, doc.run_id).model_dump() == doc.model_dump()


def test_ingest_command_stores_the_runners_document(db_url: str, cpu_and_jax_document, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "results.json"
    path.write_text(cpu_and_jax_document.to_json())
    with pytest.raises(SystemExit) as exit_info:
        main(["ingest", str(path), "--db", db_url])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.split() == [cpu_and_jax_document.run_id]
