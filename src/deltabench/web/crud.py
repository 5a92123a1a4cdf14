"""The service's writes, as keyword-only functions (reads live in ``deltabench.db.queries``; the job queue's
state machine in ``deltabench.db.jobs``, re-exported here).

Routes and pages call these inside a session; the caller's ``session_scope`` commits.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from sqlalchemy.orm import Session

from deltabench.db.ingest import store_documents
from deltabench.db.jobs import FINAL_JOB_STATUSES, JOB_STATUSES, cancel_job, create_job, update_job_status
from deltabench.db.models import Annotation, QueuedJob
from deltabench.harness.document import ResultDocument
from deltabench.harness.errors import BadInput

__all__ = [
    "FINAL_JOB_STATUSES",
    "JOB_STATUSES",
    "META_QUEUE_JOB",
    "add_annotation",
    "cancel_job",
    "create_job",
    "ingest_batch",
    "update_job_status",
]

# A result document whose meta carries this key (a queued job's id) marks that job done when it is ingested.
META_QUEUE_JOB = "queue_job_id"


_INT64 = 2**63 - 1


def _storable_problem(value: Any) -> tuple[str, str] | None:
    """(where in `value`, what) of the first thing a database cannot hold, else None."""
    if value is None or isinstance(value, (bool, float)):
        return None
    if isinstance(value, int):
        return None if -_INT64 - 1 <= value <= _INT64 else ("", f"integer {value} does not fit in 64 bits")
    if isinstance(value, str):
        if "\x00" in value:
            return "", "text may not contain NUL characters"
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return "", "text is not valid Unicode (a lone surrogate)"
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            if (found := _storable_problem(key)) is not None:
                return "", found[1]
            if (found := _storable_problem(item)) is not None:
                return f".{key}{found[0]}", found[1]
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            # Most lists are raw samples: floats, passed over without a call each.
            if type(item) is not float and (found := _storable_problem(item)) is not None:
                return f"[{i}]{found[0]}", found[1]
    return None


def _check_storable(value: Any, where: str) -> None:
    """Refuse what a database cannot hold: integers beyond 64 bits, strings with NUL or lone surrogates."""
    found = _storable_problem(value)
    if found is not None:
        raise BadInput(f"{where}{found[0]}: {found[1]}")


# What the JSON text of a value a database cannot hold must contain: a NUL escape (or byte), a surrogate escape or
# UTF-8-encoded surrogate (a lone one among them), or a JSON number that may be an integer of 64 bits or more: 19
# digits before any fraction, or an exponent of 19 or more (pydantic takes 1e30 as an integer). The text part is a
# regular expression run only where the text holds a backslash-u escape, a NUL or a byte 0xED; the numbers are
# found by plain byte searches (a regular expression trying every delimiter of the samples' arrays took a third of
# the server's work on an ingest).
_MAYBE_UNSTORABLE_TEXT = re.compile(rb"\\u0000|\x00|\\u[dD][89abcdefABCDEF]|\xed[\xa0-\xbf]")
_EXPONENT_19 = re.compile(rb"\+?(?:19|[2-9][0-9]|[0-9]{3})")
# Digits become "0" and "E" becomes "e", so one search finds a digit run of any digits or an exponent of either case.
_DIGITS_AS_ZERO = bytes.maketrans(b"123456789E", b"000000000e")
_ZERO, _DOT, _MINUS = ord("0"), ord("."), ord("-")
_SPACE = frozenset(b" \t\n\r\f\v")
_DELIMITER = frozenset(b":,[")


def _after_delimiter(raw: bytes, end: int) -> bool:
    """Whether the number whose text ends just before `end` (exclusive: its first character is at `end`) follows a
    delimiter ``:``, ``,`` or ``[``, optional whitespace and an optional minus sign, as a JSON value does."""
    j = end - 1
    if j >= 0 and raw[j] == _MINUS:
        j -= 1
    while j >= 0 and raw[j] in _SPACE:
        j -= 1
    return j >= 0 and raw[j] in _DELIMITER


def _long_integer_part(raw: bytes, zeros: bytes) -> bool:
    """A JSON number with 19 or more digits before any fraction (`zeros`: `raw` with every digit made "0")."""
    i = zeros.find(b"0" * 19)
    while i >= 0:
        if (i == 0 or zeros[i - 1] != _ZERO) and _after_delimiter(raw, i):
            return True
        k = i + 19
        while k < len(zeros) and zeros[k] == _ZERO:
            k += 1
        i = zeros.find(b"0" * 19, k)
    return False


def _large_exponent(raw: bytes, zeros: bytes) -> bool:
    """A JSON number ``digits[.digits]e[+]NN`` with an exponent of 19 or more (`zeros` as above)."""
    for mark in (b"e0", b"e+0"):
        i = zeros.find(mark)
        while i >= 0:
            if _EXPONENT_19.match(raw, i + 1) and _mantissa_after_delimiter(zeros, raw, i):
                return True
            i = zeros.find(mark, i + 1)
    return False


def _mantissa_after_delimiter(zeros: bytes, raw: bytes, e: int) -> bool:
    """Whether the text before the exponent mark at `e` is a JSON value's mantissa: digits, optionally a dot and
    more digits, after a delimiter (:func:`_after_delimiter`)."""
    j = e - 1
    while j >= 0 and zeros[j] == _ZERO:
        j -= 1
    if j >= 0 and zeros[j] == _DOT:
        k = j - 1
        while k >= 0 and zeros[k] == _ZERO:
            k -= 1
        return k < j - 1 and _after_delimiter(raw, k + 1)
    return j < e - 1 and _after_delimiter(raw, j + 1)


def may_hold_unstorable(raw: bytes) -> bool:
    """Whether the JSON text `raw` may hold something a database cannot (see :func:`_storable_problem`): when
    False, walking the parsed documents for it finds nothing, and costs a sixth of an ingest's time."""
    if (b"\\u" in raw or b"\x00" in raw or b"\xed" in raw) and _MAYBE_UNSTORABLE_TEXT.search(raw):
        return True
    zeros = raw.translate(_DIGITS_AS_ZERO)
    return _long_integer_part(raw, zeros) or _large_exponent(raw, zeros)


def ingest_batch(
    session: Session, *, docs: Sequence[ResultDocument], raw: bytes | None = None
) -> tuple[list[str], int, int]:
    """Store result documents (idempotently); returns the run ids, how many jobs the batch carried and how many of
    them were new (the rest were stored already). `raw`: the JSON text the documents were parsed from, when there
    is one (their check for values a database cannot hold is skipped when the text cannot hold any).

    A document whose ``meta`` names a queued job (``queue_job_id``) marks that job done with this run.
    """
    for i, doc in enumerate(docs if raw is None or may_hold_unstorable(raw) else ()):
        _check_storable(doc.model_dump(), f"documents[{i}]")
    run_ids: list[str] = []
    new_jobs = 0
    for run_id, stored in store_documents(session, docs):
        run_ids.append(run_id)
        new_jobs += stored
    for doc in docs:
        queue_id = doc.meta.get(META_QUEUE_JOB)
        if isinstance(queue_id, int) and not isinstance(queue_id, bool):
            job = session.get(QueuedJob, queue_id)
            if job is not None and job.status != "cancelled":
                worker = doc.meta.get("worker") if isinstance(doc.meta.get("worker"), str) else None
                update_job_status(session, job=job, status="done", run_id=doc.run_id, worker=worker)
    from .services import forget_runs

    forget_runs(run_ids)
    return run_ids, sum(len(doc.jobs) for doc in docs), new_jobs


def add_annotation(
    session: Session,
    *,
    series_key: str,
    kind: str,
    note: str,
    author: str | None,
    run_id: str | None = None,
    git_commit: str | None = None,
) -> Annotation:
    """Store a human's verdict on a change point of a series and return it."""
    row = Annotation(series_key=series_key, kind=kind, note=note, author=author, run_id=run_id, git_commit=git_commit)
    session.add(row)
    session.flush()
    return row
