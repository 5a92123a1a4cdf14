"""``deltabench list``: ops and impls, with their availability on this machine and why not."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import typer

from deltabench.cli.options import device_option, import_option, load_imports

__all__ = ["list_impls", "register"]


def _impl_rows(device: str) -> list[dict[str, Any]]:
    """One row per registered impl: its contract fields and whether (else why not) it is available on `device`."""
    from deltabench.harness.registry import all_impls

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
                "varlen": impl.varlen,
                "available": why is None,
                "reason": why or "",
                "source": impl.source,
                "notes": impl.notes,
            }
        )
    return rows


def list_impls(device: str | None = None, *, imports: Sequence[str] = (), as_json: bool = False) -> int:
    """Print the ops and the impls (after importing `imports`) with their availability on `device` (default: cuda
    if present, else cpu): rich tables, or with `as_json` one JSON object. Returns 0."""
    import json

    from rich.console import Console

    from deltabench.harness.devices import default_device, parse_platform
    from deltabench.harness.ops import OPS

    load_imports(list(imports))
    device = parse_platform(device) if device is not None else default_device().platform
    rows = _impl_rows(device)
    if as_json:
        ops = {
            name: {"title": s.title, "args": list(s.args), "signature": s.signature, "rule": s.rule}
            for name, s in OPS.items()
        }
        print(json.dumps({"device": device, "ops": ops, "impls": rows}, indent=1))
        return 0
    console = Console()
    _print_ops(console, OPS)
    _print_impls(console, rows, device)
    return 0


def list_command(
    device: str = device_option("cuda if present, else cpu", purpose="Judge availability for this device: "),
    import_: list[str] = import_option(),
    json_: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> int:
    """List ops and impls with their availability on this machine."""
    return list_impls(device, imports=import_, as_json=json_)


def register(app: typer.Typer) -> None:
    """Add the ``list`` command to `app`."""
    app.command("list")(list_command)


_ALL_DTYPES = ["fp32", "bf16", "fp16"]


def _print_ops(console: Any, ops: dict[str, Any]) -> None:
    """The op contracts: a short table, then each op's per-token rule on its own line (never cut)."""
    from rich import box
    from rich.table import Table

    table = Table(title="ops", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("op", "name", "call"):
        table.add_column(col, no_wrap=col != "call")
    for name, spec in ops.items():
        table.add_row(name, spec.title, spec.signature)
    console.print(table)
    for name, spec in ops.items():
        console.print(f"  {name}: {spec.rule}", highlight=False, soft_wrap=True)
    console.print()


def _print_impls(console: Any, rows: list[dict[str, Any]], device: str) -> None:
    """The impls: one compact row each, then the full reason (and notes) of each one not available here."""
    from rich import box
    from rich.table import Table

    table = Table(
        title=f"impls (availability on {device})",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        padding=(0, 1),
        collapse_padding=True,
    )
    # Wider than the console (80 columns when piped), a cell folds onto a second line: no header or value is cut.
    # Wider than the console (80 columns when piped), a cell folds onto a second line (devices and dtypes at their
    # commas): no header or value is cut short.
    for col in ("op", "impl", "backend", "devices", "dtypes", "bwd", "varlen", "here"):
        table.add_column(col, overflow="fold", min_width=len(col))
    for r in rows:
        dtypes = "all" if sorted(r["dtypes"]) == sorted(_ALL_DTYPES) else ", ".join(r["dtypes"])
        table.add_row(
            r["op"],
            r["impl"],
            r["backend"],
            ", ".join(r["devices"]),
            dtypes,
            "yes" if r["backward"] else "no",
            "yes" if r["varlen"] else "no",  # takes packed sequences (cu_seqlens)
            "[green]yes[/]" if r["available"] else "[red]no[/]",
        )
    console.print(table)
    unavailable = [r for r in rows if not r["available"]]
    if unavailable:
        console.print(f"why not on {device}:")
        for r in unavailable:
            console.print(f"  {r['op']}/{r['impl']}: {r['reason']}", highlight=False, soft_wrap=True)
    noted = [r for r in rows if r["notes"]]
    if noted:
        console.print("notes:")
        for r in noted:
            console.print(f"  {r['op']}/{r['impl']}: {r['notes']}", highlight=False, soft_wrap=True)
