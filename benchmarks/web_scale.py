"""Dashboard and API latency at scale: millions of stored results in SQLite or PostgreSQL (a benchmark script, not a
test).

Fills the store (``--db``: an SQLite path or a database URL) to ``--results`` results with benchmarks/db_scale.py's
filler: a fleet of four machine classes (h200, a100, cpu, tpu-v5e; two hosts each), runs of ``--per-run`` jobs spread
over gdn, gdn2, kda and sdm (its S, D, W, R dims in ``extra_dims``), one run every 5 minutes up to now, one re-run
of a commit in ten, a few percent of jobs incorrect, 1% noise with rare outliers and a +8% step coming and going in
every ninth case's series (change points); raw samples and two verification records per result. A fresh PostgreSQL
store is written with COPY and indexed afterwards. Then it starts the real app under uvicorn on a free port and
measures, with an HTTP client over a socket, p50/p95/p99 over ``--requests`` requests each of:

- the run page and API (random runs), and a page of the runs list from a random run on (keyset); the comparison
  page's first views (distinct random pairs, the comparison cache cold), the same pairs again (cached) and the
  comparison API's first views (the pairs reversed, the cache emptied); a series' history page and API (random
  series); the series list page (``/history`` without a series, all ops or one) and API; the regressions
  page and API (every series active in the last 90 days); ``db.frame.results_frame`` over one op, impl and machine
  class in the last 30 days (called in-process);
- the batch ingest rate through ``POST /api/v1/runs`` with ``--writers`` concurrent writers (``--batch`` documents of
  ``--per-run`` jobs per request), and a count afterwards that nothing was lost;
- the store's size on disk.

Targets (issue 45, on the two-core machine): at 10M results on PostgreSQL p95 <= 100 ms for the run, comparison
(first view), history and regressions pages and APIs, ingest >= 5,000 results/s with 4 writers; SQLite at 1M within
its figures of issue 4 (pages p95 22-62 ms, ingest 2,463-3,614 results/s). Usage::

    python benchmarks/web_scale.py                      # 1M results in /tmp/deltabench_web_scale.db (reused)
    python benchmarks/web_scale.py --db postgresql+psycopg://postgres@127.0.0.1:5432/scale --results 10000000

Figures: docs/guide/storing.md ("The store at scale").
"""

from __future__ import annotations

import argparse
import datetime as dt
import pathlib
import random
import socket
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlencode

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import db_scale  # benchmarks/db_scale.py: the filler and its documents

UTC = dt.timezone.utc


def fill(db: str, n_results: int, per_run: int) -> None:
    """Bring the store to `n_results` results with benchmarks/db_scale.py's filler."""
    from sqlalchemy import func, select

    from deltabench.db.engine import get_engine, session_scope
    from deltabench.db.models import Result

    engine = get_engine(db)
    with session_scope(engine) as session:
        have = session.execute(select(func.count()).select_from(Result)).scalar_one()
    if have >= n_results:
        return
    print(f"filling {n_results - have:,} results ...", flush=True)
    seconds = db_scale.fill(engine, n_results - have, per_run)
    print(f"filled in {seconds:.0f} s", flush=True)


def store_size(db: str) -> str:
    """The store's size on disk: the SQLite file, or the PostgreSQL database with its biggest tables."""
    from sqlalchemy import text

    from deltabench.db.engine import get_engine

    if "://" not in db or db.startswith("sqlite"):
        path = pathlib.Path(db.split("///")[-1])
        return f"{path.stat().st_size / 2**30:.2f} GiB"
    with get_engine(db).connect() as conn:
        total = conn.execute(text("SELECT pg_database_size(current_database())")).scalar_one()
        parts = conn.execute(
            text(
                "SELECT relname, pg_total_relation_size(oid) FROM pg_class WHERE relkind = 'r' "
                "AND relnamespace = 'public'::regnamespace ORDER BY 2 DESC LIMIT 4"
            )
        ).all()
    return f"{total / 2**30:.2f} GiB (" + ", ".join(f"{n} {b / 2**30:.2f}" for n, b in parts) + " GiB with indexes)"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_processes(db: str, workers: int) -> tuple[str, object]:
    """The real app under uvicorn with `workers` worker processes (as a deployment runs it), in a subprocess; its
    base URL and the process (to stop it)."""
    import os
    import subprocess

    import httpx

    port = _free_port()
    argv = [sys.executable, "-m", "uvicorn", "deltabench.web.app:create_app", "--factory", "--port", str(port)]
    argv += ["--workers", str(workers), "--log-level", "warning"]
    proc = subprocess.Popen(argv, env={**os.environ, "DELTABENCH_DB": db})
    base = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(base + "/api/v1/runs?limit=1", timeout=5).status_code == 200:
                return base, proc
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("the server did not start")


def serve(db: str) -> tuple[str, object]:
    """The real app under uvicorn in a thread; its base URL and the server (to stop it)."""
    import uvicorn

    from deltabench.web.app import create_app
    from deltabench.web.config import Settings

    port = _free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_app(Settings(db_url=db, dispatch_jobs=False)), port=port, log_level="warning")
    )
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    return f"http://127.0.0.1:{port}", server


def timed(client, urls: list[str]) -> list[float]:  # type: ignore[no-untyped-def]
    """Milliseconds per GET, each answered 200."""
    out = []
    for url in urls:
        t = time.perf_counter()
        r = client.get(url)
        out.append((time.perf_counter() - t) * 1e3)
        if r.status_code != 200:
            raise SystemExit(f"GET {url}: {r.status_code} {r.text[:300]}")
    return out


def refreshed(client) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """Poll the regressions API until no series waits for the server's background refresh: the first view's
    milliseconds (the table as it stood), and the seconds until the table was up to date."""
    t = time.perf_counter()
    first_ms = timed(client, ["/api/v1/regressions"])[0]
    while client.get("/api/v1/regressions").json()["pending_series"]:
        time.sleep(0.2)
    return first_ms, time.perf_counter() - t


def series_query(key) -> str:  # type: ignore[no-untyped-def]
    """The history page's and API's query string for a ``db.queries.SeriesKey``."""
    query = {"op": key.op, "impl": key.impl, "shape": key.shape_id, "dtype": key.dtype, "mode": key.mode}
    query["machine"] = key.machine_kind
    query["software"] = key.software
    return urlencode(query)


def pct(values: list[float], q: float) -> float:
    """The q-quantile (0..1) by linear interpolation."""
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def ingest(base: str, token: str, bodies: list[bytes], writers: int) -> float:
    """Post every body to ``/api/v1/runs`` from `writers` threads (one client each); the seconds it took."""
    import httpx

    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}

    def post(chunk: list[bytes]) -> None:
        with httpx.Client(base_url=base, timeout=600) as client:
            for body in chunk:
                resp = client.post("/api/v1/runs", content=body, headers=headers)
                if resp.status_code != 201:
                    raise SystemExit(f"ingest: {resp.status_code} {resp.text[:300]}")

    t = time.perf_counter()
    with ThreadPoolExecutor(writers) as pool:
        list(pool.map(post, [bodies[i::writers] for i in range(writers)]))
    return time.perf_counter() - t


def main() -> None:
    """Fill, serve, measure, print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default="/tmp/deltabench_web_scale.db", help="SQLite path or database URL")
    parser.add_argument("--results", type=int, default=1_000_000)
    parser.add_argument("--per-run", type=int, default=100)
    parser.add_argument("--requests", type=int, default=60)
    parser.add_argument("--batch", type=int, default=10, help="documents per ingest request")
    parser.add_argument("--ingest-requests", type=int, default=20)
    parser.add_argument("--writers", type=int, default=4, help="concurrent ingest clients")
    parser.add_argument(
        "--server-workers", type=int, default=1, help="uvicorn worker processes (1: the app in a thread of this one)"
    )
    parser.add_argument("--fresh", action="store_true", help="delete the SQLite store first")
    args = parser.parse_args()

    import httpx
    from sqlalchemy import func, select

    from deltabench.db import queries
    from deltabench.db.engine import get_engine, session_scope
    from deltabench.db.frame import results_frame
    from deltabench.db.models import Result, Run
    from deltabench.web import services
    from deltabench.web.security.tokens import create_token

    if args.fresh and "://" not in args.db:
        for suffix in ("", "-wal", "-shm"):
            pathlib.Path(args.db + suffix).unlink(missing_ok=True)
    fill(args.db, args.results, args.per_run)
    engine = get_engine(args.db)
    with session_scope(engine) as session:
        runs = list(session.scalars(select(Run.run_id).order_by(Run.created_at.desc(), Run.id.desc())))
        stored = session.execute(select(func.count()).select_from(Result)).scalar_one()
        token = create_token(session, name=f"bench-{uuid.uuid4().hex[:6]}")
        all_series = queries.list_series(session, limit=100_000)
    print(f"store: {stored:,} results in {len(runs):,} runs, {len(all_series):,} series, {store_size(args.db)}")

    base, server = serve(args.db) if args.server_workers == 1 else serve_processes(args.db, args.server_workers)
    rng = random.Random(0)
    results: dict[str, list[float]] = {}
    with httpx.Client(base_url=base, timeout=600) as client:
        # Warm the app before measuring (imports such as scipy.stats, templates): one of each page, on runs and
        # pairs that are not measured below.
        timed(client, ["/", f"/runs/{runs[0]}", f"/compare?base={runs[0]}&head={runs[1]}"])
        # A filled store's series are all marked: the server builds the regressions table in the background.
        build_ms, build_s = refreshed(client)
        results["run page"] = timed(client, [f"/runs/{rng.choice(runs)}" for _ in range(args.requests)])
        results["run API"] = timed(client, [f"/api/v1/runs/{rng.choice(runs)}" for _ in range(args.requests)])
        # The runs list, a page from anywhere in the store (keyset: `before` a run, as `next_before` hands it back).
        results["runs list API"] = timed(
            client, [f"/api/v1/runs?limit=50&before={rng.choice(runs)}" for _ in range(args.requests)]
        )
        # First views: distinct pairs never requested before, and the comparison cache emptied, so every measured
        # request loads both runs and grades every job.
        pairs: list[tuple[str, str]] = []
        while len(pairs) < args.requests:
            pair = (rng.choice(runs), rng.choice(runs))
            if pair[0] != pair[1] and pair not in pairs and pair != (runs[0], runs[1]):
                pairs.append(pair)
        services.forget_runs(runs)
        results["comparison page"] = timed(client, [f"/compare?base={a}&head={b}" for a, b in pairs])
        results["comparison, cached"] = timed(client, [f"/compare?base={a}&head={b}" for a, b in pairs])
        api_pairs = [(b, a) for a, b in pairs]  # the same runs the other way round: first views again
        services.forget_runs(runs)
        results["comparison API"] = timed(client, [f"/api/v1/compare/runs?base={a}&head={b}" for a, b in api_pairs])
        picks = [rng.choice(all_series) for _ in range(args.requests)]
        results["history page"] = timed(client, [f"/history?{series_query(k)}" for k in picks])
        picks = [rng.choice(all_series) for _ in range(args.requests)]
        results["history API"] = timed(client, [f"/api/v1/history?{series_query(k)}" for k in picks])
        ops = sorted({key.op for key in all_series})
        results["series list page"] = timed(
            client, [f"/history?op={rng.choice(['', *ops])}" for _ in range(args.requests)]
        )
        results["series API"] = timed(client, [f"/api/v1/series?op={rng.choice(ops)}" for _ in range(args.requests)])
        results["regressions page"] = timed(client, ["/regressions"] * args.requests)
        results["regressions API"] = timed(client, ["/api/v1/regressions"] * args.requests)
    frames = []
    since = dt.datetime.now(UTC) - dt.timedelta(days=30)
    for _ in range(max(5, args.requests // 6)):
        key = rng.choice(all_series)
        t = time.perf_counter()
        frame = results_frame(engine, op=key.op, impl=key.impl, machine_kind=key.machine_kind, since=since)
        frames.append((time.perf_counter() - t) * 1e3)
    results[f"results_frame ({len(frame):,} rows)"] = frames
    for name, ms in results.items():
        p50, p95, p99 = pct(ms, 0.5), pct(ms, 0.95), pct(ms, 0.99)
        print(f"{name:30s} p50 {p50:7.1f} ms  p95 {p95:7.1f} ms  p99 {p99:7.1f} ms  (n={len(ms)})")

    # New runs, stamped after every stored one, their jobs the filler's cases: what the fleet's runners post next.
    # Serialised up front, as a worker sends them: the timing covers the server's work only.
    kinds = db_scale.KINDS
    bodies = []
    now = dt.datetime.now(UTC)
    for r in range(args.ingest_requests):
        docs = [
            db_scale.make_document(
                kinds[(r * args.batch + j) % len(kinds)],
                args.per_run,
                rng,
                r=len(runs) + r * args.batch + j,
                created_at=now + dt.timedelta(seconds=r * args.batch + j),
            )
            for j in range(args.batch)
        ]
        bodies.append(('{"documents": [' + ",".join(d.model_dump_json() for d in docs) + "]}").encode())
    elapsed = ingest(base, token, bodies, args.writers)
    n = args.ingest_requests * args.batch * args.per_run
    with session_scope(engine) as session:
        after = session.execute(select(func.count()).select_from(Result)).scalar_one()
    lost = stored + n - after
    with httpx.Client(base_url=base, timeout=600) as client:
        after_ms, after_s = refreshed(client)
    print(
        f"regressions API: first view {build_ms:,.0f} ms while the server built the table from every series in the "
        f"background ({build_s:,.1f} s); first view after the ingest below {after_ms:,.0f} ms, the series it touched "
        f"refreshed {after_s:,.1f} s later"
    )
    print(
        f"batch ingest, {args.writers} writers: {n / elapsed:,.0f} results/s  ({n:,} results in {args.ingest_requests} "
        f"requests of {args.batch} documents x {args.per_run} jobs, {elapsed:.1f} s, "
        f"{sum(map(len, bodies)) / 2**20:.0f} MiB; {lost} lost)"
    )
    if args.server_workers == 1:
        server.should_exit = True  # type: ignore[attr-defined]
    else:
        server.terminate()  # type: ignore[attr-defined]
        server.wait()  # type: ignore[attr-defined]
    if lost:
        raise SystemExit(f"{lost} results lost")


if __name__ == "__main__":
    main()
