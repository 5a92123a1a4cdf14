"""Exceptions deltabench raises on purpose.

::

    DeltabenchError
     +-- BadInput            the user asked for something malformed or unknown (CLI exit code 2)
     |    +-- UnknownOp
     |    +-- UnknownImpl
     +-- ImplUnavailable     the impl exists but cannot run here or on this case (with the reason)
"""

from __future__ import annotations

__all__ = ["BadInput", "DeltabenchError", "ImplUnavailable", "UnknownImpl", "UnknownOp"]


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
