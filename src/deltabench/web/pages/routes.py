"""The pages: thin handlers that read through ``services``/``db.queries`` and render a template.

Forms (submit a job, annotate a change point) carry the bearer token in a password field; a valid token is
then kept in a strict same-site, HTTP-only cookie so the next form needs none.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from deltabench.db import queries
from deltabench.harness.errors import BadInput

from .. import charts, crud, schemas, services
from ..api.routes.jobs import submit
from ..deps import TOKEN_COOKIE, ReadAccessDep, SessionDep, check_token
from .render import render

__all__ = ["router"]

router = APIRouter(include_in_schema=False)

Param = Annotated[str | None, Query(max_length=512, pattern=r"^[^\x00]*$")]
FormText = Annotated[str, Form(max_length=20_000)]


def _lines(text: str) -> list[str]:
    """Items of a form field: one per line or comma-free token (shapes keep their commas)."""
    return [line.strip() for line in text.replace("\r", "").split("\n") if line.strip()]


def _words(text: str) -> list[str]:
    return [w for w in text.replace(",", " ").split() if w]


@router.get("/", response_class=HTMLResponse)
def runs_page(
    request: Request,
    session: SessionDep,
    _read: ReadAccessDep,
    suite: Param = None,
    machine: Param = None,
    commit: Param = None,
    page: Annotated[int, Query(ge=1, le=100_000)] = 1,
) -> Response:
    """The runs list, newest first, with a form to compare two of them."""
    per_page = 50
    filters = {"suite": suite or None, "machine_kind": machine or None, "commit": commit or None}
    runs = queries.list_runs(session, limit=per_page, offset=(page - 1) * per_page, **filters)
    total = queries.count_runs(session, **filters)
    return render(
        request, "runs.html", runs=runs, total=total, page=page, per_page=per_page, filters=filters, nav="runs"
    )


@router.get("/runs/{run_id}", response_class=HTMLResponse)
def run_page(run_id: str, request: Request, session: SessionDep, _read: ReadAccessDep) -> Response:
    """One run: its environment and a pivot table per op (impl x case)."""
    doc = services.load_run(session, run_id, checks="failed_jobs")  # the page lists failing checks only
    figures = charts.run_figures(doc)
    return render(request, "run.html", doc=doc, tables=services.run_tables(doc), figures=figures, nav="runs")


# Runs the compare page's pickers offer (newest first; its filter box narrows them in the browser).
RECENT_RUNS = 50


def _impl_names() -> list[str]:
    """Registered impl names, suggested by the compare page's impl fields."""
    from deltabench.harness.registry import all_impls

    return sorted({impl.name for impl in all_impls()})


@router.get("/compare", response_class=HTMLResponse)
def compare_page(
    request: Request,
    session: SessionDep,
    _read: ReadAccessDep,
    base: Param = None,
    head: Param = None,
    run: Param = None,
    base_impl: Param = None,
    head_impl: Param = None,
    threshold: Annotated[float, Query(ge=0.0, lt=10.0)] = 0.05,
    alpha: Annotated[float, Query(gt=0.0, lt=1.0)] = 0.01,
) -> Response:
    """Base vs contender: two runs (``base``, ``head``), or two impls of one run (``run``, ``base_impl``,
    ``head_impl``)."""
    comparison = None
    if base and head:
        comparison = services.compare_two_runs(session, base=base, head=head, threshold=threshold, alpha=alpha)
    elif run and base_impl and head_impl:
        comparison = services.compare_impls_in_run(
            session, run=run, base_impl=base_impl, head_impl=head_impl, threshold=threshold, alpha=alpha
        )
    recent = queries.list_runs(session, limit=RECENT_RUNS)
    ratios = charts.ratio_figure(comparison) if comparison else None
    return render(
        request,
        "compare.html",
        comparison=comparison,
        recent=recent,
        impl_names=_impl_names(),
        figures=[ratios] if ratios else [],
        form={"base": base, "head": head, "run": run, "base_impl": base_impl, "head_impl": head_impl},
        threshold=threshold,
        alpha=alpha,
        nav="compare",
    )


@router.get("/history", response_class=HTMLResponse)
def history_page(
    request: Request,
    session: SessionDep,
    _read: ReadAccessDep,
    op: Param = None,
    impl: Param = None,
    shape: Param = None,
    dtype: Param = None,
    mode: Param = None,
    machine: Param = None,
    software: Param = None,
    x: Annotated[str, Query(pattern="^(time|commit)$")] = "time",
) -> Response:
    """A series' median with its IQR band over time or commits, change points marked; else the series list."""
    fields = (op, impl, shape, dtype, mode, machine)
    if all(fields):
        key = services.series_key_of(
            session,
            op=op,
            impl=impl,
            shape=shape,
            dtype=dtype,
            mode=mode,
            machine_kind=machine,  # type: ignore[arg-type]
            software=software,
        )
        history = services.series_history(session, key)
        history_json = history.model_dump(mode="json", include={"points", "change_points"})
        return render(
            request, "history.html", history=history, history_json=history_json, x=x, series=None, nav="history"
        )
    series = queries.list_series(session, op=op or None, impl=impl or None, machine_kind=machine or None, limit=500)
    return render(request, "history.html", history=None, x=x, series=series, nav="history")


def _jobs_context(session: SessionDep) -> dict[str, object]:
    from deltabench.harness.ops import OPS
    from deltabench.harness.suites import shipped_suites

    return {
        "jobs": queries.list_queued_jobs(session, limit=100),
        "workers": queries.list_workers(session),
        "suites": shipped_suites(),
        "ops": sorted(OPS),
        "nav": "jobs",
    }


@router.get("/jobs", response_class=HTMLResponse)
def jobs_page(request: Request, session: SessionDep, _read: ReadAccessDep) -> Response:
    """The job queue, the workers, and a form to submit a job."""
    return render(request, "jobs.html", error=None, form={}, **_jobs_context(session))


@router.post("/jobs", response_class=HTMLResponse)
def submit_job_form(
    request: Request,
    session: SessionDep,
    token: FormText = "",
    suite: FormText = "",
    ops: FormText = "",
    impls: FormText = "",
    shapes: FormText = "",
    dtypes: FormText = "",
    modes: FormText = "",
    device_kind: FormText = "cpu",
) -> Response:
    """Submit a job from the queue page's form; back to the queue on success, the form with the reason if not."""
    form = {
        "suite": suite,
        "ops": ops,
        "impls": impls,
        "shapes": shapes,
        "dtypes": dtypes,
        "modes": modes,
        "device_kind": device_kind,
    }
    given = token.strip() or request.cookies.get(TOKEN_COOKIE, "")
    try:
        row = check_token(session, given)
    except Exception as exc:
        status = getattr(exc, "status_code", 403)
        detail = getattr(exc, "detail", str(exc))
        return render(request, "jobs.html", status_code=status, error=detail, form=form, **_jobs_context(session))
    try:
        body = schemas.JobSubmit(
            suite=suite.strip() or None,
            ops=_words(ops),
            impls=_words(impls),
            shapes=_lines(shapes),
            dtypes=_words(dtypes),
            modes=_words(modes),
            device_kind=device_kind.strip() or "cpu",
        )
        submit(request, session, body, row.name)
    except (BadInput, ValueError) as exc:
        return render(request, "jobs.html", status_code=422, error=str(exc), form=form, **_jobs_context(session))
    response = RedirectResponse("/jobs", status_code=303)
    response.set_cookie(TOKEN_COOKIE, given, httponly=True, samesite="strict")
    return response


@router.get("/regressions", response_class=HTMLResponse)
def regressions_page(
    request: Request,
    session: SessionDep,
    _read: ReadAccessDep,
    only_regressions: bool = False,
    since_days: Annotated[int, Query(ge=1, le=3650)] = 90,
    machine: Param = None,
    op: Param = None,
) -> Response:
    """The latest change point of each active series (optionally only slowdowns), with annotate forms."""
    found = services.latest_change_points(
        session, since_days=since_days, only_regressions=only_regressions, machine_kind=machine or None, op=op or None
    )
    return render(
        request,
        "regressions.html",
        found=found,
        only_regressions=only_regressions,
        since_days=since_days,
        error=None,
        nav="regressions",
    )


@router.post("/regressions/annotate", response_class=HTMLResponse)
def annotate_form(
    request: Request,
    session: SessionDep,
    series_key: Annotated[str, Form(min_length=1, max_length=512)],
    kind: Annotated[str, Form(pattern="^(acknowledged|expected)$")],
    token: FormText = "",
    note: Annotated[str, Form(max_length=4000)] = "",
    run_id: Annotated[str, Form(max_length=128)] = "",
    git_commit: Annotated[str, Form(max_length=64)] = "",
) -> Response:
    """Annotate a change point from the regressions page; back to the page afterwards."""
    given = token.strip() or request.cookies.get(TOKEN_COOKIE, "")
    row = check_token(session, given)
    crud.add_annotation(
        session,
        series_key=series_key,
        kind=kind,
        note=note,
        author=row.name,
        run_id=run_id or None,
        git_commit=git_commit or None,
    )
    response = RedirectResponse("/regressions", status_code=303)
    response.set_cookie(TOKEN_COOKIE, given, httponly=True, samesite="strict")
    return response
