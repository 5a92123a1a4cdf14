"""``deltabench worker``: a fleet worker that executes jobs from a Celery queue and posts results to a server."""

from __future__ import annotations

import os
from collections.abc import Sequence

import typer

from deltabench.cli.options import device_option, import_option, load_imports, resolve_imports

__all__ = ["register", "run_worker"]


def _check_options(
    *,
    queues: Sequence[str],
    server: str,
    token: str | None,
    broker: str | None,
    concurrency: int,
    device: str | None,
    timeout: float | None,
) -> str | None:
    """Refuse a missing token or broker and malformed options (bad input, exit 2); return `device` as a platform
    (None: from each job's device kind)."""
    import re

    from deltabench.harness.errors import BadInput

    if not token:
        raise BadInput("--token (or $DELTABENCH_TOKEN) is needed: make one with `deltabench token create`")
    if not broker:
        raise BadInput("--broker (or $DELTABENCH_BROKER) is needed, e.g. redis://127.0.0.1:6379/0")
    if not server.startswith(("http://", "https://")):
        raise BadInput(f"--server {server!r}: give an http:// or https:// URL")
    if concurrency < 1:
        raise BadInput("--concurrency must be at least 1")
    if device is not None:
        from deltabench.harness.devices import parse_platform

        device = parse_platform(device)
    if timeout is not None and timeout <= 0:
        raise BadInput("--timeout must be a positive number of seconds")
    bad = [q for q in queues if not re.fullmatch(r"[a-z0-9][a-z0-9._-]{0,63}", q)]
    if bad:
        raise BadInput(f"--queue {bad[0]!r}: a device kind is lowercase letters, digits, '.', '_' or '-'")
    return device


def _celery_argv(queues: Sequence[str], hostname: str, concurrency: int, log_level: str) -> list[str]:
    """The Celery worker's command line: one job per accelerator."""
    # `solo` runs the job in this process's main thread (nothing else to lose when the worker is killed);
    # several at a time run in threads, each job in its own process anyway.
    pool = ["--pool", "solo"] if concurrency == 1 else ["--pool", "threads", "--concurrency", str(concurrency)]
    return [
        "worker",
        "--queues",
        ",".join(queues),
        *pool,
        "--hostname",
        hostname,
        "--without-mingle",
        "--without-gossip",
        "--loglevel",
        log_level,
    ]


def run_worker(
    queues: Sequence[str],
    server: str,
    *,
    token: str | None = None,
    broker: str | None = None,
    concurrency: int = 1,
    device: str | None = None,
    imports: Sequence[str] = (),
    timeout: float | None = None,
    name: str | None = None,
    log_level: str = "INFO",
) -> int:
    """Take jobs for the device kinds `queues` from `broker` (default $DELTABENCH_BROKER), `concurrency` at a time,
    each in its own process, and post each result document to `server` with `token` (default $DELTABENCH_TOKEN),
    until stopped. Returns 0.

    Raises:
        BadInput: no token or broker, a malformed option, an --import that fails.
    """
    token = token or os.environ.get("DELTABENCH_TOKEN")
    broker = broker or os.environ.get("DELTABENCH_BROKER")
    device = _check_options(
        queues=queues,
        server=server,
        token=token,
        broker=broker,
        concurrency=concurrency,
        device=device,
        timeout=timeout,
    )
    specs = resolve_imports(list(imports))
    load_imports(specs)  # fail here, not in every job, when a module is missing

    import logging

    from deltabench.fleet.fleet import WorkerConfig, configure_worker, make_celery

    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per status poll is noise

    configure_worker(
        server=server,
        token=token,
        name=name,
        device=device,
        imports=specs,
        timeout_s=timeout,
        concurrency=concurrency,
    )
    celery_app = make_celery(broker)
    celery_app.worker_main(argv=_celery_argv(queues, WorkerConfig.name, concurrency, log_level))
    return 0


def worker_command(
    queue: list[str] = typer.Option(
        ..., "--queue", "-Q", help="Device kind(s) to take jobs for: h200, tpu-v5e, cpu ... (repeatable)."
    ),
    server: str = typer.Option(..., "--server", help="The deltabench server that stores results (http://...)."),
    token: str = typer.Option(
        None, "--token", help="A write token of that server (default: $DELTABENCH_TOKEN).", show_default=False
    ),
    broker: str = typer.Option(None, "--broker", help="Celery broker URL (default: $DELTABENCH_BROKER)."),
    concurrency: int = typer.Option(
        1, "--concurrency", "-c", help="Jobs at a time, one per accelerator (job i sees only GPU i)."
    ),
    device: str = device_option("from each job's device kind"),
    import_: list[str] = import_option(),
    timeout: float = typer.Option(None, "--timeout", help="Seconds per case before it is killed (timeout)."),
    name: str = typer.Option(None, "--name", help="This worker's name (default: worker<pid>@<host>)."),
    log_level: str = typer.Option("INFO", "--log-level", help="Celery's log level."),
) -> int:
    """Execute benchmark jobs from the broker's queue(s), each in its own process, posting each result
    document to the server with the token. A killed worker's job is delivered again to another worker."""
    return run_worker(
        queue,
        server,
        token=token,
        broker=broker,
        concurrency=concurrency,
        device=device,
        imports=import_,
        timeout=timeout,
        name=name,
        log_level=log_level,
    )


def register(app: typer.Typer) -> None:
    """Add the ``worker`` command to `app`."""
    app.command("worker")(worker_command)
