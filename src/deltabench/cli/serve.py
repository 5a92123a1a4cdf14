"""``deltabench serve``: the dashboard and JSON API (FastAPI under uvicorn), with a local worker by default."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import typer

from deltabench.cli.options import db_option, import_option, load_imports, resolve_imports

__all__ = ["register", "serve"]


def _start_local_worker(engine_url: str, imports: list[str], on_stored: Callable[[], None]) -> object | None:
    """Start the embedded worker of ``deltabench.fleet.dispatch`` (None when that layer is not installed); its jobs
    import `imports` first, and `on_stored()` follows each document it stores."""
    try:
        from deltabench.fleet.dispatch import start_local_worker
    except ImportError:
        print("deltabench serve: no local worker (deltabench.fleet.dispatch is not installed): jobs stay queued")
        return None
    return start_local_worker(engine_url, imports=imports, on_stored=on_stored)


def serve(
    db: str | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    local_worker: bool = True,
    log_level: str = "info",
    imports: Sequence[str] = (),
) -> int:
    """Serve the dashboard and the /api/v1 JSON API on `db` at http://`host`:`port`/ until stopped, with a worker
    in this process for submitted jobs when `local_worker` and no broker is configured. Returns 0.

    Raises:
        BadInput: a port outside 0-65535, an --import that fails.
    """
    import uvicorn

    from deltabench.db.engine import get_engine
    from deltabench.harness.errors import BadInput
    from deltabench.web.app import create_app
    from deltabench.web.config import Settings

    if not 0 <= port <= 65535:
        raise BadInput(f"--port {port}: use 0-65535")
    specs = resolve_imports(list(imports))
    load_imports(specs)
    settings = Settings.from_env(db_url=db)
    application = create_app(settings)
    engine = get_engine(settings.db_url)
    if local_worker and not settings.broker_url:
        url = engine.url.render_as_string(hide_password=False)
        _start_local_worker(url, specs, on_stored=application.state.series_refresher.wake)
    print(f"deltabench serve: http://{host}:{port}/ on {engine.url.render_as_string(hide_password=True)}")
    uvicorn.run(application, host=host, port=port, log_level=log_level)
    return 0


def serve_command(
    db: str = db_option(),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    port: int = typer.Option(8000, "--port", help="Port to listen on."),
    local_worker: bool = typer.Option(
        True, "--local-worker/--no-local-worker", help="Run submitted jobs here when no broker is configured."
    ),
    log_level: str = typer.Option("info", "--log-level", help="uvicorn's log level."),
    import_: list[str] = import_option(),
) -> int:
    """Serve the dashboard (runs, comparisons, history, regressions, job queue) and the /api/v1 JSON API."""
    return serve(db, host=host, port=port, local_worker=local_worker, log_level=log_level, imports=import_)


def register(app: typer.Typer) -> None:
    """Add the ``serve`` command to `app`."""
    app.command("serve")(serve_command)
