"""``deltabench list``: ops and impls, with their availability on this machine and why not."""

from __future__ import annotations

import typer

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    """Add the ``list`` command to `app`."""

    @app.command("list")
    def list_command(
        device: str = typer.Option(
            None, help="Judge availability for this device (default: cuda if present, else cpu)."
        ),
        import_: list[str] = typer.Option([], "--import", help="A module or .py file that registers impls."),
        json_: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    ) -> int:
        """List ops and impls with their availability on this machine."""
        import json

        from deltabench.harness.ops import OPS
        from deltabench.harness.registry import all_impls, load_module
        from rich.console import Console
        from rich.table import Table

        for spec in import_:
            load_module(spec)
        if device is None:
            import torch

            device = "cuda" if torch.cuda.is_available() else "cpu"
        rows = []
        for impl in all_impls():
            why = impl.unavailable_reason(device)
            rows.append(
                {
                    "op": impl.op,
                    "impl": impl.name,
                    "backend": impl.backend,
                    "devices": list(impl.devices),
                    "dtypes": list(impl.dtypes),
                    "backward": impl.supports_backward,
                    "available": why is None,
                    "reason": why or "",
                    "source": impl.source,
                    "notes": impl.notes,
                }
            )
        if json_:
            ops = {name: {"title": s.title, "args": list(s.args), "rule": s.rule} for name, s in OPS.items()}
            print(json.dumps({"device": device, "ops": ops, "impls": rows}, indent=1))
            return 0
        console = Console()
        ops_table = Table(title="ops", title_justify="left")
        for col in ("op", "name", "signature", "per token"):
            ops_table.add_column(col)
        for name, s in OPS.items():
            ops_table.add_row(name, s.title, f"({', '.join(s.args)}, scale, initial_state)", s.rule)
        console.print(ops_table)
        table = Table(title=f"impls (availability on {device})", title_justify="left")
        for col in ("op", "impl", "backend", "devices", "dtypes", "bwd", "available"):
            table.add_column(col)
        for r in rows:
            avail = "[green]yes[/]" if r["available"] else f"[red]no[/]: {r['reason']}"
            if r["notes"]:
                avail += f" ({r['notes']})"
            table.add_row(
                r["op"],
                r["impl"],
                r["backend"],
                ",".join(r["devices"]),
                ",".join(r["dtypes"]),
                "yes" if r["backward"] else "no",
                avail,
            )
        console.print(table)
        return 0
