"""Rendering a comparison: the rich table of the CLI, the markdown of a pull-request comment, the summary line."""

from __future__ import annotations

from typing import Any

from .noise import SAME_RUN
from .result import DIFFERENT, OUTCOMES, SAME, UNKNOWN, Comparison, JobComparison

__all__ = ["print_comparison", "render_markdown", "resolution_hint", "summary_line"]

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
    if s is None or s.ci_low is None or s.ci_high is None:
        return "-"
    return f"[{s.ci_low:.3f}, {s.ci_high:.3f}]"


def _fmt_p(r: JobComparison) -> str:
    s = r.stats
    if s is None or not s.tested:
        return "-"
    return f"{s.pvalue:.1e}" if s.pvalue < 1e-3 else f"{s.pvalue:.3f}"


def _fmt_noise(r: JobComparison) -> str:
    """The run-to-run bound the change was held against, and where its spread came from."""
    s = r.stats
    if s is None or s.noise_bound is None:
        return "-"
    if s.spread_source == "history":
        where = f"{s.history_runs} runs"
    elif s.spread_source == "repetitions":
        where = f"{s.base_repetitions}+{s.head_repetitions} repetitions"
    elif s.spread_source == SAME_RUN:
        where = "same run"
    else:
        where = "no history"
    return f"\u00b1{s.noise_bound:.1%} ({where})"


def _fmt_mdc(r: JobComparison) -> str:
    """The minimum detectable change of a timed job ("-" when it has none: nothing could have been seen)."""
    s = r.stats
    if s is None or s.min_detectable_change is None:
        return "-"
    return f"\u00b1{s.min_detectable_change:.1%}"


def _fmt_verdict(r: JobComparison) -> str:
    return (r.verdict or "-").upper()


def resolution_hint(cmp: Comparison) -> str:
    """What would resolve a comparison's unknown jobs ("" when none is unknown)."""
    unknown = [r for r in cmp.rows if r.verdict == UNKNOWN]
    if not unknown:
        return "" if cmp.verdict != UNKNOWN else "nothing could be compared: run both sides on one machine class"
    base = cmp.base_commit[:10] if cmp.base_commit else "BASE"
    sources = {r.stats.spread_source if r.stats else None for r in unknown}
    if cmp.interleaved or sources <= {"repetitions"}:
        return f"run with more repetitions (deltabench run --repeat auto --base-ref {base} --max-repeat N)"
    return (
        f"run with --repeat auto --base-ref {base} (interleaved repetitions), or gate against a stored history "
        "of 5+ runs (--db)"
    )


def _shape(r: JobComparison) -> str:
    from deltabench.harness.pytest_benchmark import EXTERNAL_OP

    return "-" if r.op == EXTERNAL_OP else r.key[2]


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else ("es" if word.endswith("s") else "s"))


def summary_line(cmp: Comparison) -> str:
    """One line: verdict, counts per outcome, the rule's parameters, and which runs were compared."""
    c = cmp.counts
    v = cmp.verdicts
    verdict = "FAIL" if cmp.failed else ("UNKNOWN" if cmp.verdict == UNKNOWN else "PASS")
    parts = [
        f"{v[SAME]} same, {v[DIFFERENT]} different, {v[UNKNOWN]} unknown",
        _plural(c["regression"], "regression"),
        _plural(c["correctness_failure"], "correctness failure"),
        _plural(c["improvement"], "improvement"),
        f"{c['within_noise']} within noise",
        f"{c['not_comparable']} not comparable",
    ]
    if cmp.missing_in_head:
        note = "allowed" if cmp.allow_missing else "a failure; --allow-missing accepts it"
        parts.append(f"{cmp.missing_in_head} missing in head ({note})")
    if cmp.head_incomplete:
        parts.append("head run incomplete (" + ("allowed" if cmp.allow_missing else "a failure") + ")")

    def side(commit: str | None, run_id: str) -> str:
        return f"`{commit[:10]}` (run {run_id[:8]})" if commit else f"run {run_id[:8]}"

    together = "; interleaved in one invocation (same machine states)" if cmp.interleaved else ""
    if cmp.looks > 1:
        together += f"; sequential repetitions, alpha {cmp.alpha:g} a look over {cmp.looks} looks"
    resolve = ""
    if v[UNKNOWN] or cmp.verdict == UNKNOWN:
        could_miss = cmp.max_detectable_change
        if could_miss is not None and could_miss > cmp.threshold:
            miss = f"changes up to {could_miss:+.1%} could go unseen; "
        else:
            miss = "run-to-run spread not measured; " if v[UNKNOWN] else ""
        resolve = f"; {miss}to resolve: {resolution_hint(cmp)}"
    return (
        f"**{verdict}**: {', '.join(parts)}; threshold {cmp.threshold:.0%}, alpha {cmp.alpha:g}; "
        f"base {side(cmp.base_commit, cmp.base_run_id)} vs head {side(cmp.head_commit, cmp.head_run_id)}{together}"
        f"{resolve}"
    )


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _md_table(rows: list[JobComparison], *, level: float, with_stats: bool) -> list[str]:
    if with_stats:
        head = (
            "| verdict | op | impl | shape | dtype | mode | base ms | head ms | ratio "
            f"| {level * 100:.4g}% CI | p | noise | min detectable | why |"
        )
        lines = [head, "|---|---|---|---|---|---|--:|--:|--:|--:|--:|--:|--:|---|"]
        for r in rows:
            op, impl, _, dtype, mode = r.key
            lines.append(
                f"| {_fmt_verdict(r)} | {op} | `{_md_escape(impl)}` | {_shape(r)} | {dtype} | {mode} "
                f"| {_fmt_ms(r.base_median_ms)} | {_fmt_ms(r.head_median_ms)} | {_fmt_ratio(r)} | {_fmt_ci(r)} "
                f"| {_fmt_p(r)} | {_fmt_noise(r)} | {_fmt_mdc(r)} | {_md_escape(r.reason)} |"
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
    if cmp.head_incomplete:
        out += ["> The head run was cut short (its document says it is incomplete).", ""]
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
    unknown = [r for r in cmp.by_outcome("within_noise") if r.verdict == UNKNOWN]
    if unknown:
        out += [
            f"#### Unknown ({len(unknown)}): cannot tell a {cmp.threshold:.0%} change from noise",
            "",
            f"To resolve: {resolution_hint(cmp)}.",
            "",
            *_md_table(unknown, level=level, with_stats=True),
            "",
        ]
    quiet = [("within_noise", True), ("not_comparable", False)]
    for outcome, with_stats in quiet:
        rows = [r for r in cmp.by_outcome(outcome) if r.verdict != UNKNOWN]
        if rows:
            label = "same (within noise)" if outcome == "within_noise" else _LABELS[outcome]
            out += [
                f"<details><summary>{len(rows)} {label}</summary>",
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

    table = Table(title=f"head vs base ({(1 - cmp.alpha) * 100:.4g}% intervals)", title_justify="left")
    for col, justify in (
        ("verdict", "left"),
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
        ("noise", "right"),
        ("min detectable", "right"),
        ("why", "left"),
    ):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for outcome in OUTCOMES:
        for r in cmp.by_outcome(outcome):
            op, impl, _, dtype, mode = r.key
            table.add_row(
                _fmt_verdict(r),
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
                _fmt_noise(r),
                _fmt_mdc(r),
                r.reason,
                style=_STYLES[outcome] or None,
            )
    console.print(table)
    if cmp.context_mismatch:
        console.print(f"runs differ in context: {cmp.context_mismatch}", style="yellow", markup=False)
    console.print(summary_line(cmp).replace("**", ""), markup=False)
