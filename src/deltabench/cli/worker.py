"""``deltabench worker``: a fleet worker that executes jobs from a Celery queue and posts results to a server."""

from __future__ import annotations

import os
from pathlib import Path

import typer

__all__ = ["register"]


def _resolve_imports(specs: list[str]) -> list[str]:
    """Absolute paths for file imports, so the job processes find them whatever their directory."""
    return [str(Path(s).resolve()) if s.endswith(".py") or Path(s).is_file() else s for s in specs]


def register(app: typer.Typer) -> None:
    """Add the ``worker`` command to `app`."""

    @app.command("worker")
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
        device: str = typer.Option(None, "--device", help="cpu, cuda or tpu (default: from each job's device kind)."),
        import_: list[str] = typer.Option([], "--import", help="A module or .py file that registers impls."),
        timeout: float = typer.Option(None, "--timeout", help="Seconds per case before it is killed (timeout)."),
        name: str = typer.Option(None, "--name", help="This worker's name (default: worker<pid>@<host>)."),
        log_level: str = typer.Option("INFO", "--log-level", help="Celery's log level."),
    ) -> int:
        """Execute benchmark jobs from the broker's queue(s), each in its own process, posting each result
        document to the server with the token. A killed worker's job is delivered again to another worker."""
        import re

        from deltabench.harness.errors import BadInput
        from deltabench.harness.registry import load_module

        token = token or os.environ.get("DELTABENCH_TOKEN")
        broker = broker or os.environ.get("DELTABENCH_BROKER")
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
        bad = [q for q in queue if not re.fullmatch(r"[a-z0-9][a-z0-9._-]{0,63}", q)]
        if bad:
            raise BadInput(f"--queue {bad[0]!r}: a device kind is lowercase letters, digits, '.', '_' or '-'")
        imports = _resolve_imports(import_)
        for spec in imports:
            load_module(spec)  # fail here, not in every job, when a module is missing

        import logging

        from deltabench.fleet.fleet import WorkerConfig, configure_worker, make_celery

        logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per status poll is noise

        configure_worker(
            server=server,
            token=token,
            name=name,
            device=device,
            imports=imports,
            timeout_s=timeout,
            concurrency=concurrency,
        )
        celery_app = make_celery(broker)
        # One job per accelerator: `solo` runs the job in this process's main thread (nothing else to lose
        # when the worker is killed); several at a time run in threads, each job in its own process anyway.
        pool = ["--pool", "solo"] if concurrency == 1 else ["--pool", "threads", "--concurrency", str(concurrency)]
        argv = [
            "worker",
            "--queues",
            ",".join(queue),
            *pool,
            "--hostname",
            WorkerConfig.name,
            "--without-mingle",
            "--without-gossip",
            "--loglevel",
            log_level,
        ]
        celery_app.worker_main(argv=argv)
        return 0
