"""Reading result files: a path in, validated :class:`ResultDocument` objects out.

``deltabench ingest`` (and anything else that takes result files) goes through :func:`load_documents`, which
accepts a deltabench result document, a JSON list of them, or any format a converter is registered for
(pytest-benchmark JSON is one). Every failure is a :class:`BadInput` naming the file, on one line.

To accept another format, register a converter: ``register_converter(detect, convert)`` where ``detect(obj)``
says whether the parsed JSON is that format and ``convert(obj)`` returns a document or a list of them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from .document import CLI_REMEDY, UNKNOWN_OP_REMEDY, ResultDocument
from .errors import BadInput, UnknownOp

__all__ = ["Converter", "load_documents", "parse_documents", "register_converter"]

Converter = tuple[Callable[[Any], bool], Callable[[Any], "ResultDocument | list[ResultDocument]"]]
_converters: list[Converter] = []


def register_converter(
    detect: Callable[[Any], bool], convert: Callable[[Any], ResultDocument | list[ResultDocument]]
) -> None:
    """Accept another file format: tried in registration order before the result-document schema."""
    _converters.append((detect, convert))


def _builtin_converters() -> list[Converter]:
    try:
        from .pytest_benchmark import is_pytest_benchmark, to_document
    except ImportError:  # pragma: no cover - the interop module is optional
        return []
    return [(is_pytest_benchmark, to_document)]


def _unknown_op(exc: ValidationError) -> str | None:
    """The reason of `exc` when its first error is an op no contract is registered for, else None."""
    first = exc.errors()[0]
    if first.get("loc", ())[-2:] == ("case", "op") and first["type"] == "value_error":
        return str(first["ctx"]["error"])
    return None


def _validation_message(exc: ValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first.get("loc", ())) or "document"
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"{where}: {first['msg']}{more}"


def parse_documents(obj: Any, *, source: str = "input") -> list[ResultDocument]:
    """Documents from parsed JSON `obj`: a converter's format, a result document, or a list of documents."""
    for detect, convert in [*_converters, *_builtin_converters()]:
        if detect(obj):
            converted = convert(obj)
            return converted if isinstance(converted, list) else [converted]
    items = obj if isinstance(obj, list) else [obj]
    if not items:
        raise BadInput(f"{source}: an empty list, no result document in it")
    docs = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise BadInput(f"{source}: not a deltabench result document (a JSON {type(item).__name__})")
        try:
            docs.append(ResultDocument.model_validate(item, context={UNKNOWN_OP_REMEDY: CLI_REMEDY}))
        except ValidationError as exc:
            where = f"{source}[{i}]" if isinstance(obj, list) else source
            unknown = _unknown_op(exc)
            if unknown:  # not a bad document: the command lacks the op's contract, and says how to load it
                raise UnknownOp(f"{where}: {unknown}") from None
            raise BadInput(f"{where}: not a valid deltabench result document: {_validation_message(exc)}") from None
    return docs


def load_documents(path: str | Path) -> list[ResultDocument]:
    """The result documents in the file at `path` (see the module docstring for the formats).

    Raises:
        BadInput: the file is missing or unreadable, not JSON, or not in any accepted format.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BadInput(f"{path}: no such file") from None
    except IsADirectoryError:
        raise BadInput(f"{path}: is a directory, not a result file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"{path}: cannot read it ({exc})") from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadInput(f"{path}: not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    return parse_documents(obj, source=str(path))
