"""``deltabench gate`` (CI: exit 1 on a regression or a correctness failure) and ``deltabench compare`` (same table,
no gating).

A run is named by a result JSON file, a pytest-benchmark JSON file, a stored run id (or a unique prefix), or a git
ref/commit (the newest stored run for that commit, preferring the other side's machine class and suite). Files need
no database, which is what a CI job without one wants.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from deltabench.harness.document import ResultDocument
    from deltabench.harness.stats import Comparison, JobComparison

__all__ = ["load_run", "parse_alpha", "parse_threshold", "register", "render_markdown"]

_LABELS = {
    "correctness_failure": "correctness failure",
    "regression": "regression",
    "improvement": "improvement",
    "within_noise": "within noise",
    "not_comparable": "not comparable",
}
_STYLES = {
    "correctness_failure": "bold red",
    "regression": "red",
    "improvement": "green",
    "within_noise": "",
    "not_comparable": "yellow",
}


def parse_threshold(text: str) -> float:
    """``"5%"`` or ``"0.05"`` -> 0.05. A bare number of 1 or more is ambiguous (5 or 500%?) and refused."""
    from deltabench.harness.errors import BadInput

    raw = str(text).strip()
    try:
        value = float(raw[:-1]) / 100.0 if raw.endswith("%") else float(raw)
    except ValueError:
        raise BadInput(f"malformed threshold {text!r}: write e.g. 5% or 0.05") from None
    if not raw.endswith("%") and value >= 1.0:
        raise BadInput(f"ambiguous threshold {text!r}: write {raw}% or {value / 100:g}")
    if not (0.0 <= value < 10.0) or math.isnan(value):
        raise BadInput(f"threshold {text!r} out of range: use 0% to 1000%")
    return value


def parse_alpha(value: float) -> float:
    """Check a significance level: a probability in (0, 0.5]."""
    from deltabench.harness.errors import BadInput

    if not (0.0 < value <= 0.5):
        raise BadInput(f"alpha {value:g} out of range: use a probability in (0, 0.5], e.g. 0.01")
    return value


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
    """Resolve `ref` in the database: exact run id, git ref, run id prefix, then commit prefix."""
    from deltabench.db import queries
    from deltabench.db.engine import get_engine, session_scope
    from deltabench.harness.errors import BadInput

    with session_scope(get_engine(db_url)) as session:
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
            for filters in tries:
                run_id = queries.latest_run_for_commit(session, commit_prefix=prefix, **filters)
                if run_id:
                    break
            if run_id is None:
                raise BadInput(f"{role} {ref!r}: no stored run for commit {prefix[:12]}")
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


def _fmt_ms(v: float | None) -> str:
    if v is None:
        return "-"
    # Four significant digits, trailing zeros kept (2.200, not 2.2), no dangling point on large values.
    return f"{v:.0f}" if v >= 1000 else f"{v:#.4g}"


def _fmt_ratio(r: JobComparison) -> str:
    s = r.stats
    if s is None:
        return "-"
    return f"{s.ratio:.3f}x ({s.ratio - 1:+.1%})"


def _fmt_ci(r: JobComparison) -> str:
    s = r.stats
    if s is None or math.isnan(s.ci_low):
        return "-"
    return f"[{s.ci_low:.3f}, {s.ci_high:.3f}]"


def _fmt_p(r: JobComparison) -> str:
    s = r.stats
    if s is None or s.method == "too few samples":
        return "-"
    return f"{s.pvalue:.1e}" if s.pvalue < 1e-3 else f"{s.pvalue:.3f}"


def _shape(r: JobComparison) -> str:
    from deltabench.harness.pytest_benchmark import EXTERNAL_OP

    return "-" if r.op == EXTERNAL_OP else r.key[2]


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else ("es" if word.endswith("s") else "s"))


def summary_line(cmp: Comparison) -> str:
    """One line: verdict, counts per outcome, the rule's parameters, and which runs were compared."""
    c = cmp.counts
    verdict = "FAIL" if cmp.failed else "PASS"
    parts = [
        _plural(c["regression"], "regression"),
        _plural(c["correctness_failure"], "correctness failure"),
        _plural(c["improvement"], "improvement"),
        f"{c['within_noise']} within noise",
        f"{c['not_comparable']} not comparable",
    ]

    def side(commit: str | None, run_id: str) -> str:
        return f"`{commit[:10]}` (run {run_id[:8]})" if commit else f"run {run_id[:8]}"

    return (
        f"**{verdict}**: {', '.join(parts)}; threshold {cmp.threshold:.0%}, alpha {cmp.alpha:g}; "
        f"base {side(cmp.base_commit, cmp.base_run_id)} vs head {side(cmp.head_commit, cmp.head_run_id)}"
    )


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _md_table(rows: list[JobComparison], *, level: float, with_stats: bool) -> list[str]:
    if with_stats:
        head = f"| op | impl | shape | dtype | mode | base ms | head ms | ratio | {level:.0%} CI | p |"
        lines = [head, "|---|---|---|---|---|--:|--:|--:|--:|--:|"]
        for r in rows:
            op, impl, _, dtype, mode = r.key
            lines.append(
                f"| {op} | `{_md_escape(impl)}` | {_shape(r)} | {dtype} | {mode} | {_fmt_ms(r.base_median_ms)} "
                f"| {_fmt_ms(r.head_median_ms)} | {_fmt_ratio(r)} | {_fmt_ci(r)} | {_fmt_p(r)} |"
            )
    else:
        lines = ["| op | impl | shape | dtype | mode | why |", "|---|---|---|---|---|---|"]
        for r in rows:
            op, impl, _, dtype, mode = r.key
            lines.append(f"| {op} | `{_md_escape(impl)}` | {_shape(r)} | {dtype} | {mode} | {_md_escape(r.reason)} |")
    return lines


def render_markdown(cmp: Comparison, *, title: str = "deltabench performance gate") -> str:
    """A pull-request comment: correctness failures, regressions and improvements with ratios and intervals, the
    rest folded away, then a one-line summary."""
    level = 1.0 - cmp.alpha
    out = [f"### {title}", ""]
    if cmp.context_mismatch:
        out += [f"> Runs differ in context ({_md_escape(cmp.context_mismatch)}): their timings are not compared.", ""]
    sections = (
        ("correctness_failure", "Correctness failures", False),
        ("regression", "Regressions", True),
        ("improvement", "Improvements", True),
    )
    for outcome, heading, with_stats in sections:
        rows = cmp.by_outcome(outcome)
        if rows:
            out += [f"#### {heading} ({len(rows)})", "", *_md_table(rows, level=level, with_stats=with_stats), ""]
    quiet = [("within_noise", True), ("not_comparable", False)]
    for outcome, with_stats in quiet:
        rows = cmp.by_outcome(outcome)
        if rows:
            out += [
                f"<details><summary>{len(rows)} {_LABELS[outcome]}</summary>",
                "",
                *_md_table(rows, level=level, with_stats=with_stats),
                "",
                "</details>",
                "",
            ]
    out.append(summary_line(cmp))
    return "\n".join(out) + "\n"


def print_comparison(cmp: Comparison, console: Any) -> None:
    """The rich table of every job (worst first) and the summary line."""
    from rich.table import Table

    table = Table(title=f"head vs base ({1 - cmp.alpha:.0%} intervals)", title_justify="left")
    for col, justify in (
        ("outcome", "left"),
        ("op", "left"),
        ("impl", "left"),
        ("shape", "left"),
        ("dtype", "left"),
        ("mode", "left"),
        ("base ms", "right"),
        ("head ms", "right"),
        ("ratio", "right"),
        ("CI", "right"),
        ("p", "right"),
        ("note", "left"),
    ):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    from deltabench.harness.stats import OUTCOMES

    for outcome in OUTCOMES:
        for r in cmp.by_outcome(outcome):
            op, impl, _, dtype, mode = r.key
            table.add_row(
                _LABELS[outcome],
                op,
                impl,
                _shape(r),
                dtype,
                mode,
                _fmt_ms(r.base_median_ms),
                _fmt_ms(r.head_median_ms),
                _fmt_ratio(r),
                _fmt_ci(r),
                _fmt_p(r),
                r.reason,
                style=_STYLES[outcome] or None,
            )
    console.print(table)
    if cmp.context_mismatch:
        console.print(f"runs differ in context: {cmp.context_mismatch}", style="yellow", markup=False)
    console.print(summary_line(cmp).replace("**", ""), markup=False)


def _compare(
    base: str, head: str, *, threshold: str, alpha: float, db: str | None, markdown: Path | None, json_out: Path | None
) -> Comparison:
    """Load both runs, compare them, print the table, write the markdown / JSON when asked."""
    from deltabench.harness.stats import compare_documents
    from rich.console import Console

    thr, alp = parse_threshold(threshold), parse_alpha(alpha)
    head_doc = load_run(head, db_url=db, role="head")
    base_doc = load_run(base, db_url=db, prefer=head_doc, role="base")
    cmp = compare_documents(base_doc, head_doc, threshold=thr, alpha=alp)
    print_comparison(cmp, Console(width=200))
    if markdown is not None:
        markdown.write_text(render_markdown(cmp))
    if json_out is not None:
        json_out.write_text(json.dumps(cmp.to_dict(), indent=1))
    compared = sum(cmp.counts[k] for k in ("regression", "improvement", "within_noise"))
    if cmp.rows and compared == 0:
        Console(stderr=True).print("warning: no job could be compared on timing", style="yellow")
    return cmp


def register(app: typer.Typer) -> None:
    """Add the ``gate`` and ``compare`` commands to `app`."""
    threshold_help = "Smallest slowdown that counts, e.g. 5% or 0.05 (asv's factor minus one)."
    alpha_help = "Significance level of the Mann-Whitney test and of the bootstrap interval (1 - alpha)."
    db_help = "Database URL or SQLite path for run ids and git refs (default: $DELTABENCH_DB or per-user)."

    @app.command("gate")
    def gate_command(
        base: str = typer.Option(..., "--base", help="Base run: result/pytest-benchmark JSON, run id or git ref."),
        head: str = typer.Option(..., "--head", help="Head run: result/pytest-benchmark JSON, run id or git ref."),
        threshold: str = typer.Option("5%", "--threshold", help=threshold_help),
        alpha: float = typer.Option(0.01, "--alpha", help=alpha_help),
        markdown: Path = typer.Option(None, "--markdown", help="Write a pull-request comment (markdown) here."),
        json_out: Path = typer.Option(None, "--json", help="Write the comparison as JSON here."),
        db: str = typer.Option(None, "--db", help=db_help),
    ) -> int:
        """Gate CI on performance: exit 1 when a job regressed or failed its correctness gate, else 0 (2: bad input).

        A job regressed when head is slower by more than the threshold (ratio of medians), the Mann-Whitney U test
        says so at alpha, and the bootstrap interval of the ratio lies above 1.
        """
        cmp = _compare(base, head, threshold=threshold, alpha=alpha, db=db, markdown=markdown, json_out=json_out)
        return 1 if cmp.failed else 0

    @app.command("compare")
    def compare_command(
        base: str = typer.Argument(..., help="Base run: result/pytest-benchmark JSON, run id or git ref."),
        head: str = typer.Argument(..., help="Head run: result/pytest-benchmark JSON, run id or git ref."),
        threshold: str = typer.Option("5%", "--threshold", help=threshold_help),
        alpha: float = typer.Option(0.01, "--alpha", help=alpha_help),
        markdown: Path = typer.Option(None, "--markdown", help="Also write the table as markdown here."),
        json_out: Path = typer.Option(None, "--json", help="Write the comparison as JSON here."),
        db: str = typer.Option(None, "--db", help=db_help),
    ) -> int:
        """Compare two runs job by job (head vs base), without gating: exit 0 unless the input is bad."""
        _compare(base, head, threshold=threshold, alpha=alpha, db=db, markdown=markdown, json_out=json_out)
        return 0
