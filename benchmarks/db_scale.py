"""How the store holds up at scale: fill a database with 1,000,000 results, then measure.

Figures (the service issue's targets in brackets):

- batch ingest through ``db.ingest.ingest_document`` into the full database, in results/s, with and without
  parsing the JSON of the documents first [>= 2,000 results/s];
- p95 latency of the queries behind the pages and the API [< 150 ms each]: the runs list, a run page (the whole
  run document: results, samples, checks), a comparison (two run documents), a series' full history.

The fill writes rows straight through SQLAlchemy Core with ids assigned here (no per-row round trips), or with COPY
into a fresh PostgreSQL store (indexes built afterwards), shaped like a fleet's suites: runs of ``--per-run``
results spread over gdn, gdn2 and kda (3 ops x 4 impls x 7 shapes x 2 dtypes x 3 modes) and sdm (its extra dims), on
four machine classes of two hosts, a run every 5 minutes up to now, one re-run of a commit in ten, a few percent
of the jobs incorrect (with no timing), a +8% step coming and going in every ninth case's series, every result
with raw samples and two verification records. Reuse it for page and API timings: ``--keep`` leaves the file, and
``--skip-fill`` measures an existing one.

    python benchmarks/db_scale.py                      # 1,000,000 results in /tmp/deltabench_scale.db
    python benchmarks/db_scale.py --results 50000      # a quick look
    python benchmarks/db_scale.py --db postgresql+psycopg://postgres@127.0.0.1/test   # any URL
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import math
import os
import random
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine, func, insert, select, text

from deltabench.db import queries
from deltabench.db.dims import dims_columns
from deltabench.db.engine import get_engine, session_scope
from deltabench.db.ingest import environment_fingerprint, ingest_document, pack_samples
from deltabench.db.models import Check, Environment, Machine, Result, ResultSamples, Run
from deltabench.harness.document import (
    CaseSpec,
    CheckRecord,
    JobResult,
    ResultDocument,
    TimingStats,
)
from deltabench.harness.document import Environment as EnvironmentDoc
from deltabench.harness.series import series_software
from deltabench.regression.noise import run_level

OPS = ("gdn", "gdn2", "kda")
IMPLS = ("torch_chunk", "triton_chunk", "fla_chunk", "jax_chunk")
SHAPES = [(1, 1024, 6, 128), (4, 4096, 6, 128), (8, 4096, 6, 128), (4, 8192, 16, 128), (1, 32768, 16, 128)]
SHAPES += [(2, 2048, 8, 64), (16, 1024, 4, 256)]
DTYPES = ("bf16", "fp32")
MODES = ("fwd", "fwd+bwd", "bwd")
# Machine classes, two hosts each; a run goes to one host of one class in turn.
KINDS = ("h200", "a100", "cpu", "tpu-v5e")
DEVICES = {"h200": "NVIDIA H200", "a100": "NVIDIA A100-SXM4-80GB", "cpu": "AMD EPYC", "tpu-v5e": "TPU v5e"}
# A case: (op, impl, dims, dtype, mode); sdm's dims beyond B, T, H go to results.extra_dims.
SDM_SHAPES = [
    {"B": 1, "T": 8192, "H": 2, "S": 65536, "D": 1024, "W": 64, "R": 64},
    {"B": 1, "T": 8192, "H": 2, "S": 128, "D": 128, "W": 128, "R": 128},
    {"B": 1, "T": 32768, "H": 2, "S": 65536, "D": 1024, "W": 64, "R": 64},
]
CASES = [
    (op, impl, {"B": B, "T": T, "H": H, "K": K, "V": K}, dtype, mode)
    for op, impl, (B, T, H, K), dtype, mode in itertools.product(OPS, IMPLS, SHAPES, DTYPES, MODES)
]
CASES += [
    ("sdm", impl, dims, dtype, mode)
    for impl, dims, dtype, mode in itertools.product(
        ("torch_chunk", "triton_chunk", "sdm_pkg_chunk"), SDM_SHAPES, DTYPES, ("fwd", "fwd+bwd")
    )
]  # 540 per run
N_SAMPLES = 20


def run_cases(per_run: int) -> list[int]:
    """The numbers of the `per_run` cases of a run, spread evenly over :data:`CASES` (every op at any size)."""
    return [i * len(CASES) // per_run for i in range(min(per_run, len(CASES)))]


T0 = dt.datetime(2025, 1, 1, tzinfo=dt.timezone.utc)
RUN_SPACING = dt.timedelta(minutes=5)  # a run every 5 minutes across the fleet: 10M results a year at 100 a run


def _environment(kind: str, commit: str, host: int = 1) -> EnvironmentDoc:
    return EnvironmentDoc(
        host=f"{kind}-node-{host}",
        machine_kind=kind,
        device_name=DEVICES[kind],
        torch="2.11.0",
        triton="3.6.0",
        cuda="13.0" if kind in ("h200", "a100") else None,
        git_commit=commit,
        deltabench="0.1.0",
    )


def _next_id(conn: Any, model: type) -> int:
    return (conn.execute(select(func.max(model.id))).scalar() or 0) + 1  # type: ignore[attr-defined]


def case_median(k: int, r: int, kind: str, rng: random.Random) -> float:
    """Run `r`'s median of case number `k` on `kind`: a base time, 1% noise, a rare outlier, and for every ninth
    case a step of +8% that comes and goes every 600 runs (so histories hold change points)."""
    op, impl, dims, _, mode = CASES[k]
    work = math.prod(dims.values()) if op == "sdm" else dims["B"] * dims["T"] * dims["H"] * dims["K"] * dims["K"]
    base = 0.05 + work / 2e9 * (1 + len(impl) % 5 * 0.2) * (3 if mode != "fwd" else 1) * (1 + KINDS.index(kind))
    step = 1.08 if k % 9 == 0 and ((r + 37 * k) // 600) % 2 else 1.0
    outlier = 1.3 if rng.random() < 0.005 else 1.0
    return base * step * outlier * (1 + 0.01 * rng.gauss(0, 1))


def _copy_text(value: Any) -> str:
    """One value in PostgreSQL's COPY text format (the filler's values hold no tab, newline or backslash)."""
    if value is None:
        return "\\N"
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, bytes):
        return "\\\\x" + value.hex()
    if isinstance(value, dict):
        return json.dumps(value)
    if isinstance(value, dt.datetime):
        return value.isoformat()
    return str(value)


class _Writer:
    """Rows into tables: PostgreSQL's COPY on a fresh store (secondary indexes built once at the end, foreign keys
    not re-checked per row: the filler assigns consistent ids), else SQLAlchemy Core inserts."""

    TABLES = (Environment, Run, Result, ResultSamples, Check)

    def __init__(self, engine: Engine, fresh: bool) -> None:
        self.engine = engine
        self.copy = engine.dialect.name == "postgresql"
        self.fresh = fresh and self.copy
        self.dropped: list[Any] = []
        if self.fresh:
            with engine.begin() as conn:
                for model in (Result, Check):
                    for index in model.__table__.indexes:  # type: ignore[attr-defined]
                        index.drop(conn)
                        self.dropped.append(index)

    def write(self, rows: dict[type, list[dict[str, Any]]]) -> None:
        """Append `rows` (per model) in one transaction."""
        if not self.copy:
            with self.engine.begin() as conn:
                for model in self.TABLES:
                    if rows[model]:
                        conn.execute(insert(model), rows[model])
            return
        raw = self.engine.raw_connection()
        try:
            cur = raw.cursor()
            cur.execute("SET session_replication_role = replica")  # no per-row foreign-key triggers
            for model in self.TABLES:
                if not rows[model]:
                    continue
                cols = list(rows[model][0])
                quoted = ", ".join(f'"{c}"' for c in cols)
                with cur.copy(f"COPY {model.__tablename__} ({quoted}) FROM STDIN") as copy:  # type: ignore[attr-defined]
                    copy.write("".join("\t".join(map(_copy_text, r.values())) + "\n" for r in rows[model]))
            cur.execute("SET session_replication_role = DEFAULT")
            raw.commit()
        finally:
            raw.close()

    def finish(self) -> None:
        """Rebuild the dropped indexes, move the id sequences past the ids assigned here, refresh statistics."""
        if not self.copy:
            return
        with self.engine.begin() as conn:
            for index in self.dropped:
                t = time.perf_counter()
                index.create(conn)
                print(f"  index {index.name}: {time.perf_counter() - t:.0f} s", flush=True)
            for table in ("runs", "results", "checks", "environments"):
                conn.execute(text(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), MAX(id)) FROM {table}"))
        with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM ANALYZE"))


def fill(engine: Engine, n_results: int, per_run: int, seed: int = 0) -> float:
    """Add about `n_results` results in runs of `per_run`, the newest run an hour ago at most; returns the
    seconds it took. On a fresh PostgreSQL store the rows go in with COPY and the indexes are built afterwards."""
    rng = random.Random(seed)
    start = time.perf_counter()
    n_runs = max(1, n_results // per_run)
    with engine.begin() as conn:
        run_id, result_id, check_id = _next_id(conn, Run), _next_id(conn, Result), _next_id(conn, Check)
        env_id = _next_id(conn, Environment)
        newest = conn.execute(select(func.max(Run.created_at))).scalar()
        machine_ids = {}
        for kind, host in itertools.product(KINDS, (1, 2)):
            env = _environment(kind, "0" * 40, host)
            found = conn.execute(select(Machine.id).where(Machine.host == env.host)).scalar()
            if found is None:
                row = {"host": env.host, "machine_kind": kind, "device_name": env.device_name, "device_count": 1}
                found = conn.execute(insert(Machine).returning(Machine.id), [{**row, "first_seen": T0}]).scalar()
            machine_ids[kind, host] = found
    first = dt.datetime.now(dt.timezone.utc) - RUN_SPACING * (n_runs + 2)
    if newest is not None:
        first = max(first, newest.replace(tzinfo=dt.timezone.utc) + RUN_SPACING)
    writer = _Writer(engine, fresh=run_id == 1)
    rows: dict[type, list[dict[str, Any]]] = {model: [] for model in _Writer.TABLES}
    commits: dict[str, str] = {}
    for r in range(n_runs):
        kind, host = KINDS[r % len(KINDS)], 1 + (r // len(KINDS)) % 2
        # Every tenth run of a class repeats its previous commit (a re-run), the rest test a new one.
        if r % 10 != 9 or kind not in commits:
            commits[kind] = uuid.UUID(int=rng.getrandbits(128)).hex + "00000000"
        commit = commits[kind]
        created = first + RUN_SPACING * r
        env = _environment(kind, commit, host)
        rows[Environment].append({"id": env_id, "fingerprint": environment_fingerprint(env), **env.model_dump()})
        rows[Run].append(
            {
                "id": run_id,
                "run_id": uuid.uuid4().hex,
                "schema_version": 1,
                "created_at": created,
                "ingested_at": created,
                "suite": f"train-{kind}",
                "git_commit": commit,
                "git_dirty": False,
                "environment_id": env_id,
                "machine_id": machine_ids[kind, host],
                "baselines": {"gdn": "torch_chunk"},
                "ceilings": {},
                "meta": {},
            }
        )
        software = series_software(env)
        for position, k in enumerate(run_cases(per_run)):
            op, impl, dims, dtype, mode = CASES[k]
            ok = rng.random() > 0.03
            median = case_median(k, r, kind, rng)
            samples = [median * (1 + 0.01 * rng.gauss(0, 1)) for _ in range(N_SAMPLES)] if ok else []
            rows[Result].append(
                {
                    "id": result_id,
                    "run_pk": run_id,
                    "job_id": uuid.uuid4().hex,
                    "attempt": 1,
                    "position": position,
                    "op": op,
                    "impl": impl,
                    **dims_columns(dims),
                    "dtype": dtype,
                    "mode": mode,
                    "regime": "typical",
                    "seed": 0,
                    "initial_state": False,
                    "run_created_at": created,
                    "git_commit": commit,
                    "machine_kind": kind,
                    "software": software,
                    "backend": "torch",
                    "device": "cuda",
                    "status": "ok" if ok else "incorrect",
                    "reason": "" if ok else "output rel_fro 0.2 > 0.016",
                    "gate_reference": "float64 oracle",
                    "notes": "",
                    "started_at": created,
                    "finished_at": created,
                    "clock": "cuda_events" if ok else None,
                    "median_ms": median if ok else None,
                    "q1_ms": median * 0.99 if ok else None,
                    "q3_ms": median * 1.01 if ok else None,
                    "mean_ms": median if ok else None,
                    "stdev_ms": median * 0.01 if ok else None,
                    "sem_rel": 0.004 if ok else None,
                    "n_samples": N_SAMPLES if ok else None,
                    "warmup": 10 if ok else None,
                    "l2_flush": True if ok else None,
                    "compile_s": None,
                    "stop_reason": "sem" if ok else None,
                    "level_ms": run_level(samples, median) if ok else None,
                    "peak_bytes": 1 << 27 if ok else None,
                    "inputs_bytes": 1 << 20 if ok else None,
                    "memory_method": "torch" if ok else None,
                    "flops": 1e9,
                    "bytes_moved": 1e8,
                    "tflops": None,
                    "gbps": None,
                    "floor_ms": None,
                    "pct_of_floor": None,
                }
            )
            if ok:
                rows[ResultSamples].append({"result_id": result_id, "samples": pack_samples(samples)})
            for position_c, check in enumerate(("output", "final_state")):
                rows[Check].append(
                    {
                        "id": check_id,
                        "result_id": result_id,
                        "position": position_c,
                        "check": check,
                        "metric": "rel_fro",
                        "value": 1e-3 if ok else 0.2,
                        "threshold": 0.016,
                        "passed": ok,
                        "gating": True,
                        "worst_index": None,
                        "seed": 0,
                        "regime": "typical",
                        "initial_state": False,
                        "reference": "oracle",
                        "detail": "",
                    }
                )
                check_id += 1
            result_id += 1
        run_id += 1
        env_id += 1
        if len(rows[Result]) >= 20_000 or r == n_runs - 1:
            writer.write(rows)
            rows = {model: [] for model in _Writer.TABLES}
        if r % 200 == 0:
            print(
                f"  fill: {r * per_run:,} / {n_runs * per_run:,} results, {time.perf_counter() - start:.0f} s",
                flush=True,
            )
    writer.finish()
    # Rows written here bypass ingest, which marks the series it touches: mark them all, as a migration of a store
    # whose regressions table was never built does (the server's background refresh then builds it).
    from deltabench.db.series_state import mark_all_dirty

    with session_scope(engine) as session:
        mark_all_dirty(session)
    return time.perf_counter() - start


def case_spec(op: str, dims: dict[str, int], dtype: str, mode: str) -> CaseSpec:
    """The document's case of a filler case (sdm's dims beyond B, T, H as extra dims)."""
    base = {d: dims[d] for d in ("B", "T", "H", "K", "V") if d in dims}
    extra = {d: v for d, v in dims.items() if d not in base}
    return CaseSpec(op=op, **base, extra_dims=extra, dtype=dtype, mode=mode)  # type: ignore[arg-type]


def make_document(
    kind: str, per_run: int, rng: random.Random, r: int = 0, created_at: dt.datetime | None = None, host: int = 1
) -> ResultDocument:
    """A document of the filler's cases on `kind`, as run number `r` (its step pattern), every job timed and
    verified: what a runner posts."""
    jobs = []
    for k in run_cases(per_run):
        op, impl, dims, dtype, mode = CASES[k]
        median = case_median(k, r, kind, rng)
        samples = sorted(median * (1 + 0.01 * rng.gauss(0, 1)) for _ in range(N_SAMPLES))
        jobs.append(
            JobResult(
                case=case_spec(op, dims, dtype, mode),
                impl=impl,
                status="ok",
                verification=[
                    CheckRecord(check=c, metric="rel_fro", value=1e-3, threshold=0.016, passed=True)
                    for c in ("output", "final_state")
                ],
                timing=TimingStats(
                    clock="cuda_events",
                    samples_ms=samples,
                    median_ms=statistics.median(samples),
                    q1_ms=samples[N_SAMPLES // 4],
                    q3_ms=samples[3 * N_SAMPLES // 4],
                    mean_ms=statistics.fmean(samples),
                    stdev_ms=statistics.stdev(samples),
                    sem_rel=0.004,
                ),
            )
        )
    commit = uuid.UUID(int=rng.getrandbits(128)).hex
    return ResultDocument(
        created_at=created_at or dt.datetime.now(dt.timezone.utc),
        suite=f"train-{kind}",
        environment=_environment(kind, commit, host),
        jobs=jobs,
    )


def _document(kind: str, per_run: int, rng: random.Random) -> ResultDocument:
    return make_document(kind, per_run, rng)


def measure_ingest(engine: Engine, n_docs: int, per_run: int) -> tuple[float, float]:
    """Results/s of ingest_document alone, and of JSON parsing plus ingest_document."""
    rng = random.Random(1)
    docs = [_document(KINDS[i % len(KINDS)], per_run, rng) for i in range(n_docs)]
    texts = [_document(KINDS[i % len(KINDS)], per_run, rng).to_json() for i in range(n_docs)]
    t = time.perf_counter()
    for doc in docs:
        with session_scope(engine) as session:
            ingest_document(session, doc)
    alone = n_docs * per_run / (time.perf_counter() - t)
    t = time.perf_counter()
    for body in texts:
        with session_scope(engine) as session:
            ingest_document(session, ResultDocument.from_json(body))
    parsed = n_docs * per_run / (time.perf_counter() - t)
    return alone, parsed


def p95(fn: Callable[[], object], trials: int) -> tuple[float, float]:
    """(median, p95) of `fn`'s wall time in ms over `trials` calls, after one warm-up call."""
    fn()
    times = []
    for _ in range(trials):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    times.sort()
    return statistics.median(times), times[min(len(times) - 1, int(0.95 * len(times)))]


def measure_queries(engine: Engine, trials: int) -> dict[str, tuple[float, float]]:
    """Median and p95 (ms) of the queries behind the runs list, a run page, a comparison and a history plot."""
    rng = random.Random(2)
    with session_scope(engine) as session:
        run_ids = list(session.scalars(select(Run.run_id).order_by(Run.id)))
        query = select(Run.run_id, Machine.machine_kind).join(Machine, Run.machine_id == Machine.id)
        kinds = {run_id: kind for run_id, kind in session.execute(query)}

    def runs_list() -> None:
        with session_scope(engine) as s:
            queries.list_runs(s, limit=50, offset=rng.randrange(0, 200))
            queries.count_runs(s)

    # The web layer builds its run page from load_run_document, and a comparison from two of them.
    def run_page() -> None:
        with session_scope(engine) as s:
            queries.load_run_document(s, rng.choice(run_ids))

    def comparison() -> None:
        base = rng.choice(run_ids)
        same_kind = [r for r in run_ids[-300:] if kinds[r] == kinds[base]]
        with session_scope(engine) as s:
            queries.load_run_document(s, base)
            queries.load_run_document(s, rng.choice(same_kind))

    def history() -> None:
        op, impl, dims, dtype, mode = rng.choice(CASES)
        with session_scope(engine) as s:
            queries.series_history(
                s,
                op=op,
                impl=impl,
                shape=dims,
                dtype=dtype,
                mode=mode,
                machine_kind=rng.choice(KINDS),
            )

    return {
        "runs list (50 runs + count)": p95(runs_list, trials),
        "run page (load_run_document)": p95(run_page, trials),
        "comparison (two load_run_document)": p95(comparison, trials),
        "series history (full)": p95(history, trials),
    }


def main() -> None:
    """Fill (unless --skip-fill), measure, print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default="/tmp/deltabench_scale.db", help="URL or SQLite path (default: %(default)s)")
    parser.add_argument("--results", type=int, default=1_000_000, help="results to fill (default: %(default)s)")
    parser.add_argument("--per-run", type=int, default=len(CASES), help="results per run (default: %(default)s)")
    parser.add_argument("--ingest-docs", type=int, default=10, help="documents to time ingest on")
    parser.add_argument("--trials", type=int, default=100, help="calls per query for the p95")
    parser.add_argument("--skip-fill", action="store_true", help="measure the database as it is")
    parser.add_argument("--keep", action="store_true", help="keep the SQLite file afterwards")
    parser.add_argument(
        "--gc-freeze",
        action="store_true",
        help="gc.freeze() after start-up, as a long-running server can: full collections then skip the start-up "
        "heap (torch's objects included), which is where the p95 outliers of the document loads come from",
    )
    args = parser.parse_args()
    if args.gc_freeze:
        import gc

        gc.collect()
        gc.freeze()
    fresh_file = "://" not in args.db and not args.skip_fill
    if fresh_file:
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(args.db + suffix):
                os.remove(args.db + suffix)
    engine = get_engine(args.db)
    if not args.skip_fill:
        seconds = fill(engine, args.results, args.per_run)
        print(f"fill: {args.results:,} results in {seconds:.0f} s ({args.results / seconds:,.0f} results/s, bulk)")
    with session_scope(engine) as s:
        total = s.scalar(select(func.count()).select_from(Result))
    print(f"database: {engine.url.render_as_string(hide_password=True)} with {total:,} results")
    alone, parsed = measure_ingest(engine, args.ingest_docs, args.per_run)
    print(
        f"batch ingest ({args.ingest_docs} documents x {args.per_run} results): {alone:,.0f} results/s "
        f"(ingest_document), {parsed:,.0f} results/s (JSON parse + ingest_document)   [target >= 2,000]"
    )
    for name, (median, p) in measure_queries(engine, args.trials).items():
        print(f"{name:40s} median {median:7.1f} ms   p95 {p:7.1f} ms   [target p95 < 150 ms]")
    if fresh_file and not args.keep:
        engine.dispose()
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(args.db + suffix):
                os.remove(args.db + suffix)


if __name__ == "__main__":
    main()
