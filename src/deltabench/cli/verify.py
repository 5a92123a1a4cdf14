"""``deltabench verify``: run the correctness gate on one impl at one case and show every check."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import typer

from deltabench.cli.options import device_option, import_option, resolve_imports

__all__ = ["default_timeout_s", "register", "summarize_records", "verify_impl", "verify_integrity"]


def summarize_records(records: list[Any]) -> list[dict[str, Any]]:
    """One row per (check, initial state, reference): the worst record over the seeds and regimes (a failure first,
    then the relative error nearest its bound), its seed, the max abs error and worst index there, and whether
    every seed passed. Records without a rel_fro metric (finite, determinism, notes) keep their own row."""
    rows: dict[tuple[Any, ...], dict[str, Any]] = {}
    max_abs: dict[tuple[Any, ...], Any] = {}
    for r in records:
        if r.metric == "max_abs":
            max_abs[(r.check, r.initial_state, r.reference, r.seed)] = r
            continue
        key = (r.check, r.initial_state, r.reference, r.metric)
        row = rows.get(key)
        if row is None:
            rows[key] = row = {"record": r, "passed": True, "n": 0, "failed_seeds": []}
        row["n"] += 1
        if r.gating and not r.passed:
            row["passed"] = False
            row["failed_seeds"].append(r.seed)
        worst = row["record"]
        # The shown record is the worst: a failure before a pass, then the larger share of its bound (the bound
        # differs between regimes and tensor sizes), then the larger value (None = no value).
        if (not r.passed, _share(r), _order(r.value)) > (not worst.passed, _share(worst), _order(worst.value)):
            row["record"] = r
    out = []
    for row in rows.values():
        r = row["record"]
        partner = max_abs.get((r.check, r.initial_state, r.reference, r.seed))
        out.append(
            {
                "check": r.check,
                "h0": r.initial_state,
                "metric": r.metric,
                "value": r.value,
                "threshold": r.threshold,
                "max_abs": partner.value if partner else None,
                "worst_index": r.worst_index,
                "seed": r.seed,
                "seeds_run": row["n"],
                "passed": row["passed"],
                "gating": r.gating,
                "reference": r.reference,
                "detail": r.detail,
            }
        )
    return out


def _order(value: float | None) -> float:
    return float("-inf") if value is None else value


def _share(r: Any) -> float:
    """A rel_fro record's value as a fraction of its bound (-inf where there is none: counts, notes)."""
    if r.metric != "rel_fro" or r.value is None or not r.threshold:
        return float("-inf")
    return r.value / r.threshold


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    if value == 0:
        return "0"
    return f"{value:.2e}"


def _parse_case(op: str, shape: str, has_imports: bool) -> tuple[Any, dict[str, int]]:
    """(`op`'s contract, its dims from `shape`); an op unknown here but given `has_imports` is (None, the dims as
    typed): the child, which imports the --import files, checks the shape against the op they register."""
    from deltabench.harness.cases import parse_shape
    from deltabench.harness.errors import BadInput, UnknownOp
    from deltabench.harness.ops import get_op
    from deltabench.references.contract import parse_dims

    try:
        contract = get_op(op)
        return contract, parse_shape(shape, op)
    except UnknownOp:
        if not has_imports:
            raise
        # An op the --import file registers: the child, which imports it, checks the shape and the regimes
        # against its contract.
        try:
            return None, parse_dims(shape)
        except ValueError as exc:
            raise BadInput(str(exc)) from None


def _packed(op: str, dims: dict[str, int], seqlens: str | None, contract: Any) -> dict[str, Any]:
    """The request's packed sequences from ``--seqlens`` (``{}`` without it): lengths summing to the shape's T
    at B = 1, checked here (an imported op's contract is checked in the child)."""
    if seqlens is None:
        return {}
    from deltabench.harness.cases import Case
    from deltabench.harness.seqlens import parse_seqlens

    lengths = parse_seqlens(seqlens)
    if contract is not None:
        Case(op, **dims, seqlens=lengths)  # BadInput: a sum other than T, B other than 1, an op without them
    return {"seqlens": list(lengths)}


def _pick_regimes(regime: Sequence[str], contract: Any) -> list[str]:
    """The gate regimes to check: those given (an unknown one is bad input), else every regime of the op's contract
    (an imported op's: none here, the child reads them)."""
    from deltabench.harness.cases import REGIMES
    from deltabench.harness.errors import BadInput

    known_regimes = contract.regimes if contract is not None else REGIMES
    unknown = [r for r in regime if r not in known_regimes]
    if unknown and contract is not None:
        raise BadInput(f"unknown gate regime {unknown[0]!r}: use {', '.join(known_regimes)}")
    # none given: every regime of the op's contract (an imported op's: the child reads them)
    return list(dict.fromkeys(regime)) or (list(known_regimes) if contract is not None else [])


def _request(
    op: str,
    impl: str,
    shape: str,
    *,
    dtype: str,
    seeds: int,
    seed: int,
    regimes: Sequence[str],
    initial_state: bool,
    mode: str | None,
    device: str | None,
    imports: Sequence[str],
    deterministic: bool,
    reference: str,
    seqlens: str | None = None,
) -> tuple[dict[str, Any], Any]:
    """(the child's request, the op's contract or None for an op an --import registers), the options checked."""
    from deltabench.harness.cases import parse_dtype
    from deltabench.harness.devices import default_device, parse_platform
    from deltabench.harness.errors import BadInput

    contract, dims = _parse_case(op, shape, bool(imports))
    dtype = parse_dtype(dtype)
    device = parse_platform(device) if device is not None else default_device().platform
    if mode is not None and mode not in ("fwd", "fwd+bwd", "decode"):
        raise BadInput(f"unknown mode {mode!r}: use fwd, fwd+bwd or decode")
    regimes = _pick_regimes(regimes, contract)
    if reference not in ("auto", "oracle", "torch_chunk"):
        raise BadInput(f"unknown reference {reference!r}: use auto, oracle or torch_chunk")
    packed = _packed(op, dims, seqlens, contract)
    request = {
        "op": op, "impl": impl, "dims": dims, "dtype": dtype, "seed": seed, "seeds": seeds, "regimes": regimes,
        "initial_state": initial_state, "mode": mode, "device": device, "deterministic": deterministic,
        "reference": reference, "imports": resolve_imports(list(imports)), **packed,
    }  # fmt: skip
    return request, contract


def verify_impl(
    op: str,
    impl: str,
    shape: str,
    *,
    dtype: str = "bf16",
    seeds: int = 3,
    seed: int = 0,
    regimes: Sequence[str] = (),
    initial_state: bool = True,
    mode: str | None = None,
    device: str | None = None,
    as_json: bool = False,
    imports: Sequence[str] = (),
    deterministic: bool = False,
    reference: str = "auto",
    all_records: bool = False,
    timeout: float | None = None,
    seqlens: str | None = None,
) -> int:
    """Run the correctness gate on `impl` of `op` at `shape` (e.g. ``B=2,T=200,H=4,K=64``) in a child process and
    print every check: a table, or with `as_json` the report and every record as JSON.

    Returns:
        0 when every gating check passed; 1 when one failed, or the child crashed, raised or hung past `timeout`
        seconds (default: :func:`default_timeout_s`).

    Raises:
        BadInput: a malformed option, an --import file that raises or exits, a shape that cannot fit in host memory.
    """
    from rich.console import Console

    from deltabench.correctness.verify_child import verify_in_child
    from deltabench.harness.errors import BadInput

    if timeout is not None and timeout <= 0:
        raise BadInput("--timeout must be a positive number of seconds")
    request, contract = _request(
        op,
        impl,
        shape,
        dtype=dtype,
        seeds=seeds,
        seed=seed,
        regimes=regimes,
        initial_state=initial_state,
        mode=mode,
        device=device,
        imports=imports,
        deterministic=deterministic,
        reference=reference,
        seqlens=seqlens,
    )
    timeout_s = timeout if timeout is not None else default_timeout_s()
    console = Console(stderr=as_json)
    shape_id = "-".join(f"{k}{v}" for k, v in request["dims"].items())  # as typed: the child completes it
    if "seqlens" in request:
        shape_id += f"-N{len(request['seqlens'])}"
    what = " ".join(x for x in (shape_id, request["dtype"], mode) if x)
    with console.status(f"verifying {op}/{impl} on {what} ({request['device']}, in a child process)"):
        outcome = verify_in_child(request, timeout_s)
    if outcome.bad_input is not None:
        raise BadInput(outcome.bad_input)
    if outcome.report is None:
        if outcome.crash is not None:
            msg = f"{op}/{impl} {outcome.crash}"
        else:
            oom = ", out of memory" if outcome.oom else ""
            msg = f"{op}/{impl} raised {outcome.error} (in {outcome.phase}{oom})"
        _print_failure(console, msg, outcome, as_json)
        return 1
    report = outcome.report
    if as_json:
        print(json.dumps(report.to_dict(), indent=1))
    else:
        _print_report(console, report, contract.title if contract else op, all_records)
    return 0 if report.passed else 1


def verify_command(
    op: str = typer.Option(..., "--op", help="Op name: gdn, gdn2, kda or sdm (see `deltabench list`)."),
    impl: str = typer.Option(..., "--impl", help="Impl name (see `deltabench list`)."),
    shape: str = typer.Option(..., "--shape", help="Dims, e.g. B=2,T=200,H=4,K=64,V=64 (V defaults to K)."),
    dtype: str = typer.Option("bf16", "--dtype", help="fp32, bf16 or fp16 (or float32, bfloat16, float16)."),
    seeds: int = typer.Option(3, "--seeds", min=1, help="Consecutive seeds from --seed; one more is drawn."),
    seed: int = typer.Option(0, "--seed", help="The first seed."),
    regime: list[str] = typer.Option(
        [], "--regime", help="Only this gate regime (repeatable): typical, long or strong (default: all three)."
    ),
    initial_state: bool = typer.Option(
        True,
        "--initial-state/--no-initial-state",
        help="Kept for the record of the case; both variants (with and without) are always checked.",
    ),
    mode: str = typer.Option(
        None,
        "--mode",
        help="fwd, fwd+bwd or decode (default: fwd+bwd with a backward, decode for a decode impl, else fwd).",
    ),
    device: str = device_option("cuda if present, else cpu"),
    json_: bool = typer.Option(False, "--json", help="Print the report and every record as JSON."),
    import_: list[str] = import_option(),
    deterministic: bool = typer.Option(
        False,
        "--deterministic",
        help="Make bitwise determinism gating (two calls, and the first again in a fresh process).",
    ),
    reference: str = typer.Option("auto", "--reference", help="auto, oracle or torch_chunk."),
    integrity: bool = typer.Option(
        False,
        "--integrity",
        help="Run the timing's integrity defences alone (no gate): a short timing in a child process, its timed "
        "calls perturbed and re-checked, its clock checked, its rate held to the machine's ceilings.",
    ),
    all_records: bool = typer.Option(False, "--all-records", help="One table row per record, every seed."),
    timeout: float = typer.Option(
        None, "--timeout", help="Seconds before the case's child process is killed (default: run's, 900)."
    ),
    seqlens: str = typer.Option(
        None,
        "--seqlens",
        help="Pack sequences of these lengths along T (cu_seqlens, B=1; they must sum to T), e.g. 17,64,1,218.",
    ),
) -> int:
    """Check an impl against the float64 oracle: outputs, states, gradients, streaming, finiteness.

    The case runs in a child process: a crash or a hang (past --timeout) is a failed verification that names
    the signal or the phase (import, inputs, call, check), exit code 1. Exit code 2: bad input, an --import
    file that raises or exits, or a shape whose inputs and oracle cannot fit in host memory.
    With --integrity the gate is skipped and the timing's integrity defences run alone (exit code 1 when one fails).
    """
    if integrity:
        return verify_integrity(
            op, impl, shape, dtype=dtype, seed=seed, mode=mode, device=device, as_json=json_, imports=import_,
            timeout=timeout,
        )  # fmt: skip
    return verify_impl(
        op,
        impl,
        shape,
        dtype=dtype,
        seeds=seeds,
        seed=seed,
        regimes=regime,
        initial_state=initial_state,
        mode=mode,
        device=device,
        as_json=json_,
        imports=import_,
        deterministic=deterministic,
        reference=reference,
        all_records=all_records,
        timeout=timeout,
        seqlens=seqlens,
    )


def verify_integrity(
    op: str,
    impl: str,
    shape: str,
    *,
    dtype: str = "bf16",
    seed: int = 0,
    mode: str | None = None,
    device: str | None = None,
    as_json: bool = False,
    imports: Sequence[str] = (),
    timeout: float | None = None,
) -> int:
    """Run the timing's integrity defences alone (runners/integrity.py) on `impl` of `op` at `shape`: the job's
    timing without its gate, in a child process, with a short budget, then the rate against the machine's ceilings;
    print every ``integrity:*`` record (a table, or JSON). Returns 0 when every gating one passed, else 1.
    """
    from rich.console import Console

    from deltabench.harness.cases import Case, parse_dtype, parse_shape
    from deltabench.harness.devices import default_device, parse_platform
    from deltabench.harness.errors import BadInput
    from deltabench.harness.registry import get_impl
    from deltabench.runners import integrity
    from deltabench.runners.base import JobSpec
    from deltabench.runners.ceilings import ceilings_for, work_figures
    from deltabench.runners.environment import collect_environment
    from deltabench.runners.isolated import IsolatedRunner

    if timeout is not None and timeout <= 0:
        raise BadInput("--timeout must be a positive number of seconds")
    if mode is not None and mode not in ("fwd", "fwd+bwd"):
        raise BadInput(f"unknown mode {mode!r}: use fwd or fwd+bwd")
    paths = resolve_imports(list(imports))
    if paths:
        from deltabench.cli.options import load_imports

        load_imports(paths)
    platform = parse_platform(device) if device is not None else default_device().platform
    found = get_impl(op, impl)
    mode = mode or ("fwd+bwd" if found.supports_backward else "fwd")
    case = Case(op, shape=parse_shape(shape, op), dtype=parse_dtype(dtype), seed=seed, mode=mode, device=platform)
    why = found.check_case(case)
    if why:
        raise BadInput(f"{op}/{impl} cannot run {case.shape_id} {case.dtype} {mode} on {platform}: {why}")
    job = JobSpec.for_case(
        case,
        impl,
        imports=paths,
        stage="after_gate",  # the gate skipped: the defences alone
        timing={"budget_s": 0.5, "min_reps": 10, "warmup_s": 0.1},
        timeout_s=timeout if timeout is not None else default_timeout_s(),
    )
    console = Console(stderr=as_json)
    with console.status(f"integrity of {op}/{impl} on {case.shape_id} {case.dtype} {mode} ({platform})"):
        result = IsolatedRunner().run(job)
        if result.status == "ok" and result.timing is not None:
            ceilings = ceilings_for(platform, collect_environment(platform).device_name)
            w = work_figures(op, case.dims, case.dtype, mode, result.timing.median_ms, ceilings)
            found_rec = integrity.plausibility_record(w.pct_of_floor, ceilings, w.tflops, w.gbps)
            integrity.flag(result, [found_rec] if found_rec else [])
    records = result.integrity
    passed = result.status == "ok"
    if as_json:
        median = result.timing.median_ms if result.timing is not None else None
        out = {"passed": passed, "status": result.status, "reason": result.reason, "median_ms": median}
        print(json.dumps({**out, "records": [r.model_dump() for r in records]}, indent=1))
        return 0 if passed else 1
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=f"integrity of {op}/{impl}: {case.shape_id} {case.dtype} {mode}", box=box.SIMPLE_HEAD)
    for col in ("defence", "value", "bound", "ok", "detail"):
        table.add_column(col, overflow="fold")
    for r in records:
        verdict = "info" if not r.gating else ("[green]pass[/]" if r.passed else "[red]FAIL[/]")
        bound = "" if r.threshold is None else f"{r.threshold:g}"
        value = "" if r.value is None else f"{r.value:.3g}"
        table.add_row(r.check.removeprefix(integrity.INTEGRITY_PREFIX), value, bound, verdict, escape(r.detail))
    console.print(table)
    if passed:
        console.print(f"[green]PASS[/]: {len(records)} integrity records, every defence passed")
    else:
        console.print(f"[red]FAIL[/]: {escape(result.reason or result.status)}", highlight=False, soft_wrap=True)
    return 0 if passed else 1


def register(app: typer.Typer) -> None:
    """Add the ``verify`` command to `app`."""
    app.command("verify")(verify_command)


def default_timeout_s() -> float:
    """``verify``'s default --timeout: the per-job timeout ``run`` uses when a suite sets none."""
    from deltabench.runners.base import JobSpec

    return float(JobSpec.model_fields["timeout_s"].default)


def _print_failure(console: Any, msg: str, outcome: Any, json_: bool) -> None:
    """A crash, a hang or an exception as one failing record: JSON, or one red line."""
    from rich.markup import escape

    from deltabench.correctness.checks import note_record

    record = note_record("crash" if outcome.crash else "exception", msg, passed=False, gating=True)
    if json_:
        out = {
            "passed": False, "error": msg, "phase": outcome.phase, "signal": outcome.signal,
            "timed_out": outcome.timed_out, "oom": outcome.oom, "records": [record.model_dump()],
        }  # fmt: skip
        print(json.dumps(out, indent=1))
    else:
        console.print(f"[red]FAIL[/] {escape(msg)}", highlight=False, soft_wrap=True)


_SHORT_NAMES = {
    "final_state": "state",
    "grad:initial_state": "grad:h0",
    "streaming:output": "stream:output",
    "streaming:final_state": "stream:state",
    "boundary:output": "bound:output",
    "boundary:final_state": "bound:state",
}


def _value_text(row: dict[str, Any]) -> str:
    metric, value = row["metric"], row["value"]
    if metric == "nonfinite_count":
        return f"{int(value or 0)} bad"
    if metric == "bitwise":
        return "identical" if value == 0 else f"off {_fmt(value)}"
    return _fmt(value)


def _print_report(console: Any, report: Any, title: str, all_records: bool) -> None:
    """The rich table of checks (fits 80 columns, folding rather than cutting), its footnotes, the seeds, the
    reference and the verdict."""
    from rich import box
    from rich.table import Table

    case = report.case
    table = Table(
        title=f"{case.op} ({title}) / {report.impl}: {case.shape_id} {case.dtype} {case.mode}",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        padding=(0, 1),
        collapse_padding=True,
    )
    for col, justify in (
        ("check", "left"), ("h0", "left"), ("rel err", "right"), ("bound", "right"), ("max abs", "right"),
        ("worst at", "left"), ("seed", "right"), ("ok", "left"),
    ):  # fmt: skip
        # The check's name and the worst element's index fold onto a second line when the row is wider than the
        # console (80 columns when piped); numbers and the verdict never wrap, and so are never cut.
        wraps = col in ("check", "worst at")
        table.add_column(col, justify=justify, no_wrap=not wraps, overflow="fold" if wraps else "ellipsis")
    if all_records:
        rows = [
            {
                "check": r.check, "h0": r.initial_state, "metric": r.metric, "value": r.value,
                "threshold": r.threshold, "max_abs": None, "worst_index": r.worst_index, "seed": r.seed,
                "passed": r.passed or not r.gating, "gating": r.gating, "reference": r.reference, "detail": r.detail,
            }
            for r in report.records
            if r.metric != "max_abs"
        ]  # fmt: skip
    else:
        rows = summarize_records(report.records)
    notes: dict[str, None] = {}
    against: dict[str, list[str]] = {}  # reference -> the checks made against it (one footnote each)
    for row in rows:
        verdict = "[green]pass[/]" if row["passed"] else "[red]FAIL[/]"
        if not row["gating"]:
            verdict = "info"
        name = _SHORT_NAMES.get(row["check"], row["check"])
        if row["reference"] not in ("oracle", "none"):
            against.setdefault(row["reference"], []).append(name)
        if row["detail"] and (not row["passed"] or not row["gating"]):
            notes[f"{name} (seed {row['seed']}): {row['detail']}"] = None
        table.add_row(
            name,
            "-" if row["h0"] is None else ("yes" if row["h0"] else "no"),
            _value_text(row),
            _fmt(row["threshold"]) if row["metric"] == "rel_fro" else "",
            _fmt(row["max_abs"]),
            "" if row["worst_index"] is None else ",".join(map(str, row["worst_index"])),
            "" if row["seed"] is None else str(row["seed"]),
            verdict,
        )
    console.print(table)
    for ref, names in against.items():
        console.print(f"  vs {ref}: {', '.join(dict.fromkeys(names))}", highlight=False, emoji=False)
    for note in notes:
        console.print(f"  {note}", highlight=False, emoji=False)
    seeds = [str(s) for s in report.seeds]
    if report.drawn_seed is not None:
        seeds[-1] = f"{report.drawn_seed} (drawn)"
    console.print(f"seeds: {', '.join(seeds)}", highlight=False)
    console.print(f"reference: {report.reference}", highlight=False)
    if report.stage_s:
        console.print(f"gate time: {report.time_record.detail}", highlight=False)
    if not all_records:
        console.print("each row shows its worst seed (--all-records: every seed; --json: every record)")
    if report.passed:
        console.print(f"[green]PASS[/]: {len(report.records)} records, every gating check within its bound")
    else:
        failed = sorted({r.check for r in report.failures})
        console.print(f"[red]FAIL[/]: {len(report.failures)} gating records failed ({', '.join(failed)})")
