"""Exceptions deltabench raises on purpose.

::

    DeltabenchError
     +-- BadInput            the user asked for something malformed or unknown (CLI exit code 2)
     |    +-- UnknownOp
     |    +-- UnknownImpl
     +-- ImplUnavailable     the impl exists but cannot run here or on this case (with the reason)
"""

from __future__ import annotations

import re

__all__ = [
    "BadInput",
    "DeltabenchError",
    "ImplUnavailable",
    "UnknownImpl",
    "UnknownOp",
    "crash_words",
    "is_out_of_memory",
    "oom_figures",
]


class DeltabenchError(Exception):
    """Base class of deltabench's own errors."""


class BadInput(DeltabenchError):
    """Malformed or unknown input from a user; the CLI prints the message on one line and exits 2."""


class UnknownOp(BadInput):
    """An op name that no op contract has."""


class UnknownImpl(BadInput):
    """An impl name not registered for the op."""


class ImplUnavailable(DeltabenchError):
    """An impl that cannot run on this machine or for this case; the message is the reason."""


def is_out_of_memory(error: BaseException | str) -> bool:
    """Whether `error` (an exception, or the text a process printed or reported) says memory ran out: Python's
    MemoryError, torch's OutOfMemoryError (CUDA's "out of memory"), JAX/XLA's RESOURCE_EXHAUSTED for memory, or
    torch's CPU allocator ("can't allocate memory"). The one rule for a job's ``oom`` status."""
    if isinstance(error, MemoryError):
        return True
    text = (error if isinstance(error, str) else f"{type(error).__name__}: {error}").lower()
    return (
        "outofmemoryerror" in text
        or "out of memory" in text
        or "can't allocate memory" in text
        or ("resource_exhausted" in text and "memory" in text and "shared memory" not in text)
    )


_SIZE = r"([0-9.]+ [KMGT]?i?B)"
_OOM_FIGURES = (
    ("tried {}", re.compile(r"Tried to allocate " + _SIZE)),
    ("{} free", re.compile(r"of which " + _SIZE + " is free")),
    ("of {}", re.compile(r"total capacity of " + _SIZE)),
    ("this process held {}", re.compile(r"this process has " + _SIZE + " memory in use")),
)


def oom_figures(reason: str) -> str:
    """The figures of a CUDA out-of-memory message in a few words, e.g. ``tried 512.00 MiB, 323.06 MiB free, of
    139.80 GiB, this process held 27.46 GiB`` (those torch's message gives; empty when it gives none): whether a
    process ran out at its own share or the device was full of others'."""
    found = [fmt.format(m.group(1)) for fmt, pattern in _OOM_FIGURES if (m := pattern.search(reason))]
    return ", ".join(found)


def crash_words(lines: list[str], limit: int) -> str:
    """What a process that died said about it, from its log's `lines` (progress marks left out), at most `limit`
    characters: faulthandler's error and the innermost frame of the crashing thread (the kernel's call, which
    faulthandler lists first), else the log's last lines."""
    lines = [ln.strip() for ln in lines if ln.strip()]
    fatal = [i for i, ln in enumerate(lines) if ln.startswith("Fatal Python error")]
    if fatal:
        frames = [ln for ln in lines[fatal[-1] :] if ln.startswith("File ")]
        return " | ".join([lines[fatal[-1]], *frames[:1]])[-limit:]
    return " | ".join(lines[-4:])[-limit:]
