"""``deltabench gate`` (CI: exit 1 on a regression, a correctness failure, or a head missing base jobs; 3 when a
job's verdict is unknown, ``--unknown`` choosing otherwise; 0 when every job is the same) and ``deltabench compare``
(same table, no gating).

A run is named by a result JSON file, a pytest-benchmark JSON file, a stored run id (or a unique prefix), or a git
ref/commit (the newest stored run for that commit other than the head's own, preferring the head's machine class and
suite). Files need no database, which is what a CI job without one wants; with a database, each job's run-to-run
spread comes from its series' history there, and runs made with ``run --repeat N`` carry their own spread between
repetitions (``harness.regression.noise``). A base and a head made in one ``run --base-ref REF`` invocation name each
other (``meta.interleaved_with``): their repetitions saw the same machine states and decide before any history.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from deltabench.cli.options import db_option, import_option, load_imports

if TYPE_CHECKING:
    from deltabench.harness.document import ResultDocument
    from deltabench.harness.series import JobKey
    from deltabench.regression import Comparison, RunSpread

__all__ = [
    "compare_runs",
    "gate_runs",
    "load_history_spreads",
    "load_run",
    "parse_alpha",
    "parse_spread",
    "parse_threshold",
    "parse_unknown",
    "register",
]

# Exit code of a gate whose verdict is unknown (`--unknown exit3`, the default).
EXIT_UNKNOWN = 3
UNKNOWN_POLICIES = ("exit3", "pass", "fail")


def _fraction(text: str, what: str, example: str) -> tuple[str, float]:
    """``"5%"`` or ``"0.05"`` -> (the stripped text, 0.05); malformed text is one line naming `what`."""
    from deltabench.harness.errors import BadInput

    raw = str(text).strip()
    try:
        return raw, float(raw[:-1]) / 100.0 if raw.endswith("%") else float(raw)
    except ValueError:
        raise BadInput(f"malformed {what} {text!r}: write e.g. {example}") from None


def parse_threshold(text: str) -> float:
    """``"5%"`` or ``"0.05"`` -> 0.05. A bare number of 1 or more is ambiguous (5 or 500%?) and refused."""
    from deltabench.harness.errors import BadInput

    raw, value = _fraction(text, "threshold", "5% or 0.05")
    if not raw.endswith("%") and value >= 1.0:
        raise BadInput(f"ambiguous threshold {text!r}: write {raw}% or {value / 100:g}")
    if not (0.0 <= value < 10.0) or math.isnan(value):
        raise BadInput(f"threshold {text!r} out of range: use 0% to 1000%")
    return value


def parse_spread(text: str) -> float:
    """A run-to-run spread: ``"3%"`` or ``"0.03"`` -> 0.03 (the standard deviation of log run medians)."""
    from deltabench.harness.errors import BadInput

    _, value = _fraction(text, "spread", "3% or 0.03")
    if not (0.0 < value < 5.0) or math.isnan(value):
        raise BadInput(f"spread {text!r} out of range: use a fraction above 0, e.g. 3%")
    return value


def parse_alpha(value: float) -> float:
    """Check a significance level: a probability in (0, 0.5]."""
    from deltabench.harness.errors import BadInput

    if not (0.0 < value <= 0.5):
        raise BadInput(f"alpha {value:g} out of range: use a probability in (0, 0.5], e.g. 0.01")
    return value


def parse_unknown(text: str) -> str:
    """Check what an unknown verdict does: ``exit3`` (exit 3), ``pass`` (exit 0) or ``fail`` (exit 1)."""
    from deltabench.harness.errors import BadInput

    value = str(text).strip().lower()
    if value not in UNKNOWN_POLICIES:
        raise BadInput(f"--unknown {text!r}: use one of {', '.join(UNKNOWN_POLICIES)}")
    return value


def gate_exit_code(cmp: Comparison, unknown: str = "exit3") -> int:
    """1 when the comparison failed (a regression, a correctness failure, a head missing jobs); else, when its
    verdict is unknown, 3 (`unknown` ``exit3``), 0 (``pass``) or 1 (``fail``); else 0 (every job the same or
    improved)."""
    from deltabench.regression.result import UNKNOWN

    if cmp.failed:
        return 1
    if cmp.verdict == UNKNOWN:
        return {"exit3": EXIT_UNKNOWN, "pass": 0, "fail": 1}[unknown]
    return 0


def _read_file(path: Path, role: str) -> ResultDocument:
    """A result document or a pytest-benchmark file (through the shared reader ``harness.documents_io``)."""
    from deltabench.harness.documents_io import load_documents
    from deltabench.harness.errors import BadInput

    docs = load_documents(path)
    if len(docs) != 1:
        raise BadInput(f"{role} {path}: holds {len(docs)} result documents; name one run")
    return docs[0]


def _git_commit(ref: str) -> str | None:
    """The full commit hash `ref` names in the current directory's git repository, or None."""
    if ref.startswith("-"):
        return None
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    sha = out.stdout.strip()
    return sha if out.returncode == 0 and re.fullmatch(r"[0-9a-f]{40,64}", sha) else None


def _run_from_db(ref: str, *, db_url: str | None, prefer: ResultDocument | None, role: str) -> ResultDocument:
    """Resolve `ref` in the database: exact run id, git ref, run id prefix, then commit prefix. A commit resolves to
    its newest run other than `prefer` (the head): a head stored by ``deltabench run`` is never its own base."""
    from deltabench.db import queries
    from deltabench.db.engine import get_engine, session_scope
    from deltabench.harness.errors import BadInput

    with session_scope(get_engine(db_url, create=False)) as session:
        run_id = ref if queries.get_run(session, run_id=ref) is not None else None
        commit = None if run_id else _git_commit(ref)
        if run_id is None and commit is None:
            try:
                run_id = queries.resolve_run_id(session, ref=ref)
            except BadInput:
                run_id = None
        if run_id is None:
            prefix = commit or (ref.lower() if re.fullmatch(r"[0-9a-fA-F]{4,64}", ref) else None)
            if prefix is None:
                raise BadInput(f"{role} {ref!r}: not a file, a stored run id, or a git ref here")
            tries: list[dict[str, Any]] = []
            if prefer is not None:
                kind = prefer.environment.machine_kind
                tries += [{"machine_kind": kind, "suite": prefer.suite or None}, {"machine_kind": kind}]
            tries.append({})
            exclude = prefer.run_id if prefer is not None else None
            for filters in tries:
                runs = queries.list_runs(session, limit=2, commit=prefix, **filters)
                run_id = next((r.run_id for r in runs if r.run_id != exclude), None)
                if run_id:
                    break
            if run_id is None:
                other = " other than the head's" if exclude else ""
                raise BadInput(f"{role} {ref!r}: no stored run{other} for commit {prefix[:12]}")
        return queries.load_run_document(session, run_id)


def load_run(
    ref: str, *, db_url: str | None = None, prefer: ResultDocument | None = None, role: str = "run"
) -> ResultDocument:
    """The run `ref` names: a result or pytest-benchmark JSON file, a stored run id (or unique prefix), or a git
    ref/commit whose newest stored run is taken (preferring `prefer`'s machine class and suite).

    Raises:
        BadInput: nothing matches, or the file is malformed.
    """
    from deltabench.harness.errors import BadInput

    if not ref or not ref.strip():
        raise BadInput(f"{role}: empty reference")
    path = Path(ref)
    if path.is_file():
        return _read_file(path, role)
    if path.suffix.lower() == ".json":
        raise BadInput(f"{role} {ref!r}: no such file")
    return _run_from_db(ref, db_url=db_url, prefer=prefer, role=role)


def load_history_spreads(base_run_id: str, *, exclude_run_id: str, db_url: str | None) -> dict[JobKey, RunSpread]:
    """Each job's run-to-run spread from its series' history in the database (``db.history.history_spreads``)."""
    from deltabench.db.engine import get_engine, session_scope
    from deltabench.db.history import history_spreads

    with session_scope(get_engine(db_url, create=False)) as session:
        return history_spreads(session, base_run_id=base_run_id, exclude_run_id=exclude_run_id)


def _compare(
    base: str,
    head: str,
    *,
    threshold: str,
    alpha: float,
    db: str | None,
    history: bool,
    allow_missing: bool,
    default_spread: str | None,
    markdown: Path | None,
    json_out: Path | None,
) -> Comparison:
    """Load both runs (refusing a base that is the head), read the history, compare, print the table, write the
    markdown / JSON when asked."""
    from rich.console import Console

    from deltabench.harness.errors import BadInput
    from deltabench.regression import GradingRule, compare_documents
    from deltabench.regression.render import print_comparison, render_markdown

    rule = GradingRule(threshold=parse_threshold(threshold), alpha=parse_alpha(alpha))
    sigma = parse_spread(default_spread) if default_spread is not None else None
    head_doc = load_run(head, db_url=db, role="head")
    base_doc = load_run(base, db_url=db, prefer=head_doc, role="base")
    if base_doc.run_id == head_doc.run_id:
        raise BadInput(f"base {base!r} and head {head!r} are the same run ({head_doc.run_id}): name another base")
    from_db = db is not None or not (Path(base).is_file() and Path(head).is_file())
    spreads = (
        load_history_spreads(base_doc.run_id, exclude_run_id=head_doc.run_id, db_url=db) if history and from_db else {}
    )
    cmp = compare_documents(
        base_doc, head_doc, rule=rule, spreads=spreads, default_sigma=sigma, allow_missing=allow_missing
    )
    print_comparison(cmp, Console(width=200))
    if markdown is not None:
        markdown.write_text(render_markdown(cmp))
    if json_out is not None:
        json_out.write_text(json.dumps(cmp.to_dict(), indent=1))
    compared = sum(cmp.counts[k] for k in ("regression", "improvement", "within_noise"))
    if cmp.rows and compared == 0:
        Console(stderr=True).print("warning: no job could be compared on timing", style="yellow")
    return cmp


def gate_runs(
    base: str,
    head: str,
    *,
    threshold: str = "5%",
    alpha: float = 0.01,
    db: str | None = None,
    history: bool = True,
    allow_missing: bool = False,
    default_spread: str | None = None,
    markdown: Path | None = None,
    json_out: Path | None = None,
    imports: Sequence[str] = (),
    unknown: str = "exit3",
) -> int:
    """Gate `head` against `base` (each a result or pytest-benchmark JSON file, a stored run id or a git ref), after
    importing `imports`: print the comparison, write it as `markdown` / `json_out` when given.

    Returns:
        1 when a job regressed by more than `threshold` (at significance `alpha`, beyond the run-to-run noise) or
        failed its correctness gate, or the head lacks base jobs or was cut short (unless `allow_missing`); else
        3 when any job's verdict is unknown (the evidence could not have seen a threshold-sized change), or 0 / 1
        for `unknown` ``pass`` / ``fail``; else 0.

    Raises:
        BadInput: a run that names nothing, base == head, a malformed threshold, alpha, spread or `unknown`.
    """
    unknown = parse_unknown(unknown)
    load_imports(list(imports))
    cmp = _compare(
        base,
        head,
        threshold=threshold,
        alpha=alpha,
        db=db,
        history=history,
        allow_missing=allow_missing,
        default_spread=default_spread,
        markdown=markdown,
        json_out=json_out,
    )
    return gate_exit_code(cmp, unknown)


def compare_runs(
    base: str,
    head: str,
    *,
    threshold: str = "5%",
    alpha: float = 0.01,
    db: str | None = None,
    history: bool = True,
    default_spread: str | None = None,
    markdown: Path | None = None,
    json_out: Path | None = None,
    imports: Sequence[str] = (),
) -> int:
    """Compare `head` with `base` job by job as :func:`gate_runs` does, without gating (a head missing jobs is
    fine): 0 unless the input is bad (:class:`BadInput`)."""
    load_imports(list(imports))
    _compare(
        base,
        head,
        threshold=threshold,
        alpha=alpha,
        db=db,
        history=history,
        allow_missing=True,
        default_spread=default_spread,
        markdown=markdown,
        json_out=json_out,
    )
    return 0


_THRESHOLD_HELP = "Smallest slowdown that counts, e.g. 5% or 0.05 (asv's factor minus one)."
_ALPHA_HELP = "Significance level: Mann-Whitney test, bootstrap interval (1 - alpha), run-to-run bound (one-sided)."
_HISTORY_HELP = "Take each job's run-to-run spread from its series' history in the database (when one is used)."
_MISSING_HELP = "Jobs of the base missing in the head, or a head run cut short, do not fail the gate."
_SPREAD_HELP = (
    "Run-to-run spread for jobs without history, e.g. 3% (measure yours with benchmarks/gate_calibration.py); "
    "default: the measured figure of the machine class (docs/guide/regression-gate.md)."
)
_UNKNOWN_HELP = (
    "What a gate whose verdict is UNKNOWN (the evidence could not have seen a threshold-sized change) does: "
    "exit3 (exit 3), pass (exit 0) or fail (exit 1)."
)
_RUN_HELP = "run: result/pytest-benchmark JSON, run id or git ref."


def gate_command(
    base: str = typer.Option(..., "--base", help=f"Base {_RUN_HELP}"),
    head: str = typer.Option(..., "--head", help=f"Head {_RUN_HELP}"),
    threshold: str = typer.Option("5%", "--threshold", help=_THRESHOLD_HELP),
    alpha: float = typer.Option(0.01, "--alpha", help=_ALPHA_HELP),
    markdown: Path = typer.Option(None, "--markdown", help="Write a pull-request comment (markdown) here."),
    json_out: Path = typer.Option(None, "--json", help="Write the comparison as JSON here."),
    db: str = db_option(),
    history: bool = typer.Option(True, "--history/--no-history", help=_HISTORY_HELP),
    allow_missing: bool = typer.Option(False, "--allow-missing", help=_MISSING_HELP),
    default_spread: str = typer.Option(None, "--default-spread", help=_SPREAD_HELP),
    unknown: str = typer.Option("exit3", "--unknown", help=_UNKNOWN_HELP),
    import_: list[str] = import_option(),
) -> int:
    """Gate CI on performance: exit 1 when a job regressed or failed its correctness gate, or the head lacks base
    jobs or was cut short (unless --allow-missing); 3 when a job is UNKNOWN (the evidence could not have seen a
    change of the threshold's size: --unknown pass|fail to choose); 0 when every job is the SAME or improved
    (2: bad input, including base == head).

    A job regressed when its best time is slower by more than the threshold, the Mann-Whitney U test and the
    bootstrap interval
    of the ratio say so within the runs, and the change exceeds the run-to-run noise: the spread of its series'
    past runs when the database has them, else the spread between its repetitions when both runs were made with
    `run --repeat N` (N >= 5), else the machine class's measured default (README, "Regression gate").
    """
    return gate_runs(
        base,
        head,
        threshold=threshold,
        alpha=alpha,
        db=db,
        history=history,
        allow_missing=allow_missing,
        default_spread=default_spread,
        markdown=markdown,
        json_out=json_out,
        imports=import_,
        unknown=unknown,
    )


def compare_command(
    base: str = typer.Argument(..., help=f"Base {_RUN_HELP}"),
    head: str = typer.Argument(..., help=f"Head {_RUN_HELP}"),
    threshold: str = typer.Option("5%", "--threshold", help=_THRESHOLD_HELP),
    alpha: float = typer.Option(0.01, "--alpha", help=_ALPHA_HELP),
    markdown: Path = typer.Option(None, "--markdown", help="Also write the table as markdown here."),
    json_out: Path = typer.Option(None, "--json", help="Write the comparison as JSON here."),
    db: str = db_option(),
    history: bool = typer.Option(True, "--history/--no-history", help=_HISTORY_HELP),
    default_spread: str = typer.Option(None, "--default-spread", help=_SPREAD_HELP),
    import_: list[str] = import_option(),
) -> int:
    """Compare two runs job by job (head vs base), without gating: exit 0 unless the input is bad."""
    return compare_runs(
        base,
        head,
        threshold=threshold,
        alpha=alpha,
        db=db,
        history=history,
        default_spread=default_spread,
        markdown=markdown,
        json_out=json_out,
        imports=import_,
    )


def register(app: typer.Typer) -> None:
    """Add the ``gate`` and ``compare`` commands to `app`."""
    app.command("gate")(gate_command)
    app.command("compare")(compare_command)
