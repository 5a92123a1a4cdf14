"""``deltabench token create|list|revoke``: bearer tokens for the service's writes (stored hashed)."""

from __future__ import annotations

import typer

__all__ = ["register"]

_DB_HELP = "Database URL or SQLite path (default: $DELTABENCH_DB or per-user)."


def register(app: typer.Typer) -> None:
    """Add the ``token`` command group to `app`."""
    group = typer.Typer(help="Bearer tokens for writes to the service (ingest, submit, cancel, annotate).")
    app.add_typer(group, name="token")

    @group.command("create")
    def create_command(
        name: str = typer.Option(..., "--name", help="Who or what the token is for (unique)."),
        db: str = typer.Option(None, "--db", help=_DB_HELP),
    ) -> int:
        """Make a token and print it once; only its sha256 hash is stored."""
        from deltabench.db.engine import get_engine, session_scope
        from deltabench.web.security.tokens import create_token

        with session_scope(get_engine(db)) as session:
            token = create_token(session, name=name)
        print(token)
        return 0

    @group.command("list")
    def list_command(db: str = typer.Option(None, "--db", help=_DB_HELP)) -> int:
        """List tokens: name, created, last used, revoked (never the tokens themselves)."""
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

    @group.command("revoke")
    def revoke_command(
        name: str = typer.Argument(..., help="The token's name."),
        db: str = typer.Option(None, "--db", help=_DB_HELP),
    ) -> int:
        """Revoke a token by name: requests with it get 403 from then on."""
        from deltabench.db.engine import get_engine, session_scope
        from deltabench.web.security.tokens import revoke_token

        with session_scope(get_engine(db)) as session:
            revoke_token(session, name=name)
        print(f"revoked {name}")
        return 0
