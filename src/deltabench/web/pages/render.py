"""Template rendering for the pages: one Jinja2 environment (autoescape on) and the number formats they share."""

from __future__ import annotations

import datetime as _dt
import math
import pathlib
from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates

from ..charts import ceiling_labels

__all__ = ["TEMPLATES_DIR", "error_page", "render", "templates"]

TEMPLATES_DIR = pathlib.Path(__file__).resolve().parent.parent / "templates"
templates = Jinja2Templates(directory=str(TEMPLATES_DIR))
# Jinja2Templates escapes .html templates already; make it unconditional so no template can opt out by its name.
templates.env.autoescape = True

OUTCOME_CLASS = {
    "regression": "bad",
    "correctness_failure": "bad",
    "improvement": "good",
    "within_noise": "neutral",
    "not_comparable": "warn",
}


def _num(x: float | None, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    if x == 0:
        return "0"
    if abs(x) >= 100:
        return f"{x:.0f}"
    return f"{x:.{digits}g}"


def _when(value: _dt.datetime | None) -> str:
    return "-" if value is None else value.astimezone(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M")


def _commit(value: str | None) -> str:
    return (value or "-")[:10]


templates.env.filters.update(num=_num, when=_when, commit=_commit, ceilings=ceiling_labels)
# same / different / unknown (regression.result, "Verdicts")
VERDICT_CLASS = {"same": "good", "different": "bad", "unknown": "warn"}
templates.env.globals.update(outcome_class=OUTCOME_CLASS, verdict_class=VERDICT_CLASS)


def render(request: Request, name: str, status_code: int = 200, **context: Any) -> HTMLResponse:
    """The template `name` rendered with `context` (every value escaped unless a template says otherwise)."""
    return templates.TemplateResponse(request, name, context, status_code=status_code)


def error_page(request: Request, status: int, detail: str) -> HTMLResponse:
    """An error shown as a page (for browsers), with the same status code as the API would give."""
    return render(request, "error.html", status_code=status, status=status, detail=detail)
