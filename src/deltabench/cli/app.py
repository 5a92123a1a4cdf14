"""The ``deltabench`` command line: the composition root.

Each command lives in ``cli/<name>.py`` as ``register(app)``: a typer function that only parses its
options and calls a plain function of typed Python values returning the exit code (``run_suite``, ``verify_impl``,
``gate_runs``, ...), which tests and scripts can call directly. The options several commands share (``--import``,
``--device``, ``--db``) are defined once, in ``cli/options.py``. Those modules import only typer (and
``cli.options``) at the top and import the layers they drive (runners, db, web) inside the functions, so
``deltabench list`` on a GPU worker never imports SQLAlchemy or FastAPI. Bad input (:class:`BadInput`, a usage
error) is one line on stderr and exit code 2; a command returns its own exit code (0 ok, 1 a check or job failed).
"""

from __future__ import annotations

import importlib
import sys

import typer

from deltabench.harness.errors import BadInput

try:  # typer >= 0.25 carries its own copy of click
    from typer._click import exceptions as _click_exc
except ImportError:  # pragma: no cover - older typer uses click itself
    from click import exceptions as _click_exc
try:  # typer's copy of click keeps Abort and Exit in typer.exceptions
    from typer.exceptions import Abort as _Abort
    from typer.exceptions import Exit as _Exit
except ImportError:  # pragma: no cover - older typer uses click's
    from click.exceptions import Abort as _Abort
    from click.exceptions import Exit as _Exit

__all__ = ["app", "main"]

app = typer.Typer(
    name="deltabench",
    help="Verify and benchmark delta-rule sequence-mixer kernels against float64 oracles.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

# Command modules, in the order `deltabench --help` lists them. A module that is missing (a layer not
# yet installed) is skipped rather than breaking the other commands.
COMMAND_MODULES = (
    "listing",
    "verify",
    "run",
    "results",
    "ingest",
    "gate",
    "serve",
    "worker",
    "token",
    "runs",
)


@app.callback()
def _root() -> None:
    """Verify and benchmark delta-rule sequence-mixer kernels against float64 oracles."""


for _name in COMMAND_MODULES:
    try:
        _mod = importlib.import_module(f"deltabench.cli.{_name}")
    except ModuleNotFoundError as _exc:
        if _exc.name != f"deltabench.cli.{_name}":
            raise
        continue
    _mod.register(app)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the console script: run the CLI and map errors to exit codes."""
    try:
        rv = app(args=argv, prog_name="deltabench", standalone_mode=False)
    except _click_exc.UsageError as exc:
        print(f"deltabench: error: {exc.format_message()}", file=sys.stderr)
        sys.exit(2)
    except BadInput as exc:
        print(f"deltabench: error: {exc}", file=sys.stderr)
        sys.exit(2)
    except Exception as exc:
        # A database that fails mid-command (a lost connection, a refused value): one line, not a traceback.
        if not type(exc).__module__.startswith("sqlalchemy."):
            raise
        from deltabench.db.engine import describe_error

        print(f"deltabench: error: database: {describe_error(exc)}", file=sys.stderr)
        sys.exit(2)
    except _Abort:
        print("deltabench: aborted", file=sys.stderr)
        sys.exit(130)
    except _Exit as exc:
        sys.exit(exc.exit_code)
    sys.exit(rv if isinstance(rv, int) else 0)


if __name__ == "__main__":
    main()
