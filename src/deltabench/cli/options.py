"""The options several commands share, defined once: ``--import``, ``--device`` and ``--db``.

Each is a factory of a ``typer.Option`` (a default in a command's signature), so every command that takes the option
spells, documents and defaults it the same way. This module imports only typer and the standard library, like every
command module, so that ``deltabench list`` on a GPU worker imports no database or web layer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

__all__ = ["DB_HELP", "IMPORT_HELP", "db_option", "device_option", "import_option", "load_imports", "resolve_imports"]

IMPORT_HELP = "A module or .py file that registers impls or ops (repeatable)."
DB_HELP = (
    "Database URL or SQLite path (default: $DELTABENCH_DB, else deltabench/deltabench.db in $XDG_DATA_HOME or "
    "~/.local/share)."
)


def import_option() -> Any:
    """``--import MODULE_OR_FILE`` (repeatable): modules or .py files to import first, which register impls or ops."""
    return typer.Option([], "--import", help=IMPORT_HELP)


def device_option(default: str, *, purpose: str = "") -> Any:
    """``--device``: cpu, cuda or tpu, None when not given; `default` says what the command takes then, `purpose`
    (a lead such as ``"Judge availability for this device: "``) what the device is for."""
    return typer.Option(None, "--device", help=f"{purpose}cpu, cuda or tpu (default: {default}).")


def db_option() -> Any:
    """``--db``: a database URL or an SQLite path, None for ``$DELTABENCH_DB`` or the per-user file."""
    return typer.Option(None, "--db", help=DB_HELP)


def resolve_imports(specs: list[str]) -> list[str]:
    """`specs` with each file import made an absolute path, so a child or job process finds it whatever its
    working directory (a module name stays as given)."""
    return [str(Path(s).resolve()) if s.endswith(".py") or Path(s).is_file() else s for s in specs]


def load_imports(specs: list[str]) -> None:
    """Import each module or .py file of `specs` here, so the impls and ops it registers are known (an import that
    fails is bad input, exit 2)."""
    from deltabench.harness.registry import load_module

    for spec in specs:
        load_module(spec)


def refresh_regressions(engine: Any) -> int:
    """After a command stored or deleted results in the store of `engine` (committed), bring the regressions page's
    table up to date for the series it touched (``web.series_refresh``), so the page lists them at once; how many
    series. 0 without the web layer's dependencies: a server on the store refreshes them then."""
    try:
        from deltabench.web.series_refresh import refresh_pending

        return refresh_pending(engine)
    except ImportError:  # deltabench[db] without [web]: change points need scipy and otava
        return 0
