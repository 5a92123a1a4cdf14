"""The ``integrity:hooks`` defence: what a timed call may not do to the interpreter it shares with the timer.

A kernel runs in the timer's own process, so it could find the integrity guard (through ``gc``, or by walking up
the call stack's frames) and turn it off, or run work outside the timed region (a profile or trace function called
as the guard begins, an interval timer's signal, a ``gc`` callback). While a guard's loop runs, between
:func:`arm` and :func:`disarm`, an audit hook (:func:`sys.addaudithook`: installed when this module is imported,
before any user module, and never removable) refuses the events that do this (:data:`REFUSED`: the ``gc`` object
walks, frame access, ``ctypes`` reads by address, signals sent to the process) by raising :class:`Refused` in the
caller, and notes each, with a profile or trace function set (:data:`NOTED`); :func:`disarm` returns them. The
watch's state lives in the hook's closure, reached only through audit events that carry :func:`arm`'s token; no
audit hook can be added after it (one could read the token). Code that prepares at import can still defeat an
in-process watch (``gc`` before any loop, ``ctypes.memmove`` to an ``id()``, which raises no audit event): these
checks raise the cost of cheating, the process boundary would end it.

:class:`InterpreterState` is what the guard compares after every call: interval timers armed, a profile or trace
function, ``gc`` callbacks, Python-level thread count.
"""

from __future__ import annotations

import _thread
import gc
import signal
import sys
from typing import Any

__all__ = ["NOTED", "REFUSED", "InterpreterState", "Refused", "arm", "disarm"]

# Audit events a timed call never needs: finding objects or frames it was not given, reading memory through ctypes
# by address, signalling the process (a signal handler is handed the interrupted frame). ctypes' other events stay
# allowed: some kernels launch through ctypes.
REFUSED = frozenset(
    {
        "gc.get_objects",
        "gc.get_referrers",
        "gc.get_referents",
        "sys._getframe",
        "sys._current_frames",
        "ctypes.cdata",  # from_address: an object's memory read or written through its address
        "ctypes.string_at",
        "ctypes.wstring_at",
        "os.kill",
        "os.killpg",
        "signal.pthread_kill",
    }
)
_FRAME_ATTRS = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_code"})  # object.__getattr__ names
_CODE_ATTRS = frozenset({"__code__", "__defaults__", "__kwdefaults__", "__globals__"})  # object.__setattr__ names
# Noted, never raised at: the interpreter itself clears a profile or trace function that raised, through these.
NOTED = frozenset({"sys.setprofile", "sys.settrace"})
_MAX_NOTED = 32
# deltabench's packages whose classes a timed call never sets attributes on (the timers, the guard, the checker)
_OWN = ("deltabench.runners.", "deltabench.correctness.", "deltabench.harness.")


class Refused(RuntimeError):
    """Raised in a timed call that tried what :data:`REFUSED` lists (the job is flagged, never timed)."""


def _refused(event: str, args: tuple[Any, ...]) -> str | None:
    """What the event is, when a timed call may not do it."""
    if event in REFUSED:
        return event
    if event == "object.__getattr__" and len(args) > 1 and args[1] in _FRAME_ATTRS:
        return f"{args[1]} of a {type(args[0]).__name__}"
    if event == "object.__setattr__" and len(args) > 1:
        owner = getattr(args[0], "__module__", "") or ""
        if args[1] in _CODE_ATTRS or owner.startswith(_OWN):
            return f"setting {getattr(args[0], '__qualname__', type(args[0]).__name__)}.{args[1]}"
    return None


_ARM, _DISARM = "deltabench.integrity.arm", "deltabench.integrity.disarm"  # the only way to reach the hook


def _install() -> None:
    """Add the audit hook. Its state lives in this closure alone: the guard reaches it only through audit events
    carrying its token (:func:`arm`, :func:`disarm`), and no other audit hook can be added after it to read them."""
    token: list[object] = []  # [the armed token], or empty
    noted: list[str] = []
    arms = [0]  # arm events since the last disarm: one, unless someone armed it again
    tampered: list[bool] = []  # a disarm without the token was tried

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event == "sys.addaudithook":
            raise Refused("no audit hook after deltabench's")  # a RuntimeError: CPython drops the new hook quietly
        if event == _ARM:
            arms[0] += 1
            args[1].append(not token)
            if not token:
                token.append(args[0])
                noted.clear()
            return
        if event == _DISARM:
            if token and token[0] is args[0]:
                args[1].append(list(noted) if arms[0] == 1 and not tampered else None)
                token.clear()
                arms[0] = 0
                tampered.clear()
            elif token:
                tampered.append(True)  # ended by someone without the token: it stays armed, and says so
            return
        if not token:
            return
        what = event if event in NOTED else _refused(event, args)
        if what is not None:
            if len(noted) < _MAX_NOTED:
                noted.append(what)
            if event not in NOTED:
                raise Refused(f"{what}: refused during a timed loop (runners/integrity_hooks.py)")

    sys.addaudithook(hook)


_install()


def arm() -> object:
    """Start refusing the :data:`REFUSED` events; returns the token :func:`disarm` needs. Raises :class:`Refused`
    when already armed."""
    token, reply = object(), []
    sys.audit(_ARM, token, reply)
    if reply != [True]:
        raise Refused("the interpreter watch is already armed")
    return token


def disarm(token: object) -> list[str] | None:
    """Stop the watch started with `token`: the refused events noted meanwhile, or None when `token` is not the
    one that armed it, or someone tried to arm or end it meanwhile."""
    reply: list[list[str]] = []
    sys.audit(_DISARM, token, reply)
    return reply[0] if reply else None


_ITIMERS = (signal.ITIMER_REAL, signal.ITIMER_VIRTUAL, signal.ITIMER_PROF)


class InterpreterState:
    """What the process looks like between timed calls; :meth:`changes` says what differs from an earlier one."""

    __slots__ = ("callbacks", "profile", "threads", "timers", "trace")

    def __init__(self) -> None:
        self.timers = tuple(signal.getitimer(t) != (0.0, 0.0) for t in _ITIMERS)
        self.profile, self.trace = sys.getprofile(), sys.gettrace()
        self.callbacks = tuple(gc.callbacks)
        self.threads = _thread._count()  # threads started from Python, _thread's own included

    def changes(self, before: InterpreterState) -> list[str]:
        """How this state differs from `before` (an interval timer armed counts whether or not it was before)."""
        names = ("REAL", "VIRTUAL", "PROF")
        out = [f"interval timer {n} armed" for n, on in zip(names, self.timers, strict=True) if on]
        if self.profile is not None or self.trace is not None:
            out.append("a profile or trace function is set")
        if self.callbacks != before.callbacks:
            out.append("gc callbacks changed")
        if self.threads > before.threads:
            out.append(f"{self.threads - before.threads} more Python threads")
        return out
