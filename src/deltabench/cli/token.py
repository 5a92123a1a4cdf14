"""``deltabench token create|list|revoke``: bearer tokens for the service's writes (stored hashed)."""

from __future__ import annotations

import typer

from deltabench.cli.options import db_option

__all__ = ["list_tokens", "make_token", "register", "revoke_named_token"]


def make_token(name: str, *, db: str | None = None) -> int:
    """Make a token named `name` in `db` and print it (the only time it is shown; its sha256 hash is stored).
    Returns 0."""
    from deltabench.db.engine import get_engine, session_scope
    from deltabench.web.security.tokens import create_token

    with session_scope(get_engine(db)) as session:
        token = create_token(session, name=name)
    print(token)
    return 0


def list_tokens(*, db: str | None = None) -> int:
    """Print `db`'s tokens, tab-separated: name, created, last used, state (never the tokens). Returns 0."""
    from deltabench.db import queries
    from deltabench.db.engine import get_engine, session_scope

    with session_scope(get_engine(db, create=False)) as session:
        rows = queries.list_api_tokens(session)
        lines = [
            "\t".join(
                [
                    r.name,
                    f"{r.created_at:%Y-%m-%d %H:%M}",
                    f"{r.last_used_at:%Y-%m-%d %H:%M}" if r.last_used_at else "never",
                    "revoked" if r.revoked else "active",
                ]
            )
            for r in rows
        ]
    print("name\tcreated\tlast used\tstate")
    for line in lines:
        print(line)
    return 0


def revoke_named_token(name: str, *, db: str | None = None) -> int:
    """Revoke the token named `name` in `db`. Returns 0."""
    from deltabench.db.engine import get_engine, session_scope
    from deltabench.web.security.tokens import revoke_token

    with session_scope(get_engine(db)) as session:
        revoke_token(session, name=name)
    print(f"revoked {name}")
    return 0


def create_command(
    name: str = typer.Option(..., "--name", help="Who or what the token is for (unique)."),
    db: str = db_option(),
) -> int:
    """Make a token and print it once; only its sha256 hash is stored."""
    return make_token(name, db=db)


def list_command(db: str = db_option()) -> int:
    """List tokens: name, created, last used, revoked (never the tokens themselves)."""
    return list_tokens(db=db)


def revoke_command(
    name: str = typer.Argument(..., help="The token's name."),
    db: str = db_option(),
) -> int:
    """Revoke a token by name: requests with it get 403 from then on."""
    return revoke_named_token(name, db=db)


def register(app: typer.Typer) -> None:
    """Add the ``token`` command group to `app`."""
    group = typer.Typer(help="Bearer tokens for writes to the service (ingest, submit, cancel, annotate).")
    app.add_typer(group, name="token")
    group.command("create")(create_command)
    group.command("list")(list_command)
    group.command("revoke")(revoke_command)
