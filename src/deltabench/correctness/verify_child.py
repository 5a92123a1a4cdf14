"""``deltabench verify``'s child process: one case verified in a fresh interpreter, with a timeout.

The CLI must outlive the kernel it checks: a segfault, a hang or an ``--import`` file that calls ``sys.exit``
would otherwise take the CLI down with it. :func:`verify_in_child` starts ``python -m
deltabench.correctness.verify_child REQUEST RESULT`` in its own session (process group), waits at most
``timeout_s`` seconds, and kills the whole group on timeout. The child writes the phase it enters to its log
(``import``: the ``--import`` modules and the impl's lookup; ``inputs``: building the first inputs; ``call``:
inside the impl; ``check``: the references and comparisons), so a crash or a hang names where it happened;
faulthandler writes a crash's Python stack there too.

The Python API :func:`deltabench.correctness.engine.verify_case` stays in-process; only the CLI isolates.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import json
import os
import pickle
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from deltabench.harness.errors import is_out_of_memory

__all__ = ["ChildOutcome", "main", "verify_in_child"]

PHASE_MARK = "deltabench-verify: phase "
_LOG_TAIL = 400  # characters of the child's log quoted in a crash's message


@dataclasses.dataclass
class ChildOutcome:
    """What became of the child: exactly one of `report` (a VerifyReport), `bad_input` (a usage error, exit
    2), `error` (the impl raised), or `crash` (the child died or timed out) is set. `phase` is where it ended."""

    report: Any = None
    bad_input: str | None = None
    error: str | None = None
    oom: bool = False
    crash: str | None = None
    signal: str | None = None
    timed_out: bool = False
    phase: str = "startup"


def _phase(name: str) -> None:
    print(PHASE_MARK + name, file=sys.stderr, flush=True)


class _Traced:
    """The impl, marking the phase around each call (``call`` inside it, ``check`` after it)."""

    def __init__(self, impl: Any) -> None:
        self._impl = impl

    def __getattr__(self, name: str) -> Any:
        return getattr(self._impl, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        _phase("call")
        out = self._impl(*args, **kwargs)
        _phase("check")
        return out


def _run(request: dict[str, Any]) -> dict[str, Any]:
    """The child's work: imports, the impl, the case, then verify_case with the phases marked."""
    from deltabench.harness.cases import Case, has_backward
    from deltabench.harness.errors import BadInput
    from deltabench.harness.ops import OPS, get_op
    from deltabench.harness.registry import get_impl, load_module

    from .memory_need import check_fits

    _phase("import")
    try:
        for spec in request["imports"]:
            try:
                load_module(spec)
            except SystemExit as exc:
                raise BadInput(f"--import {spec!r} called sys.exit({exc.code!r}) while being imported") from exc
            except BadInput:
                raise
            except BaseException as exc:
                raise BadInput(f"--import {spec!r} failed: {type(exc).__name__}: {exc}") from exc
        chosen = get_impl(request["op"], request["impl"])
        device = request["device"]
        if device == "cpu" and chosen.backend == "triton":
            # Before anything imports triton (the impls are lazy), so that the kernel runs under the interpreter.
            os.environ["TRITON_INTERPRET"] = "1"
        default = chosen.modes[0] if chosen.modes else ("fwd+bwd" if chosen.supports_backward else "fwd")
        mode = request["mode"] or default
        if mode not in ("fwd", "fwd+bwd", "decode"):
            raise BadInput(f"unknown mode {mode!r}: use fwd, fwd+bwd or decode")
        settings = {k: request[k] for k in ("dtype", "seed", "initial_state")}
        regimes = tuple(request["regimes"]) or get_op(request["op"]).regimes
        packed = {"seqlens": request["seqlens"]} if request.get("seqlens") else {}
        case = Case(request["op"], **request["dims"], **settings, **packed, regime=regimes[0], mode=mode, device=device)
        why = chosen.check_case(case)
        if why:
            raise BadInput(f"{case.op}/{chosen.name} cannot run {case.shape_id} {case.dtype} {mode} on {device}: {why}")
        # Before any input is drawn: an impossible shape is the user's, not the kernel's, failure.
        check_fits(case, reference=request["reference"], grads=has_backward(mode) and chosen.supports_backward)
    except BadInput as exc:
        return {"bad_input": str(exc)}

    from deltabench.harness.devices import placement

    from .engine import verify_case

    spec = get_op(case.op)
    make_inputs = spec.make_inputs

    def traced_inputs(*args: Any, **kwargs: Any) -> Any:
        _phase("inputs")
        out = make_inputs(*args, **kwargs)
        _phase("check")
        return out

    # This process verifies one case and ends: the op's contract may carry the phase-marking input builder.
    OPS[case.op] = dataclasses.replace(spec, make_inputs=traced_inputs)
    try:
        with placement(device, chosen.backend):  # a JAX impl computes on the case's device, never a default
            report = verify_case(
                _Traced(chosen), case, seeds=request["seeds"], gate_determinism=request["deterministic"],
                reference=request["reference"], regimes=regimes, fresh_process=True, imports=request["imports"],
            )  # fmt: skip
    except BadInput as exc:
        return {"bad_input": str(exc)}
    except Exception as exc:  # the impl raised: a failed verification
        return {"error": f"{type(exc).__name__}: {exc}".splitlines()[0][:500], "oom": is_out_of_memory(exc)}
    return {"report": report}


def main(argv: list[str] | None = None) -> int:
    """Child entry point: ``REQUEST_JSON_PATH RESULT_PATH``; the result is written atomically (pickle)."""
    faulthandler.enable()
    request_path, result_path = argv or sys.argv[1:3]
    request = json.loads(Path(request_path).read_text())
    result = _run(request)
    tmp = Path(result_path).with_suffix(".tmp")
    tmp.write_bytes(pickle.dumps(result))
    os.replace(tmp, result_path)
    return 0


def _last_phase(log: str) -> str:
    phases = [ln[len(PHASE_MARK) :].strip() for ln in log.splitlines() if ln.startswith(PHASE_MARK)]
    return phases[-1] if phases else "startup"


def _log_tail(log: str) -> str:
    """The crash's own words: faulthandler's error and innermost frame (the kernel), else the log's last lines."""
    from deltabench.harness.errors import crash_words

    return crash_words([ln for ln in log.splitlines() if not ln.startswith(PHASE_MARK)], _LOG_TAIL)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
    proc.wait()


def verify_in_child(request: dict[str, Any], timeout_s: float) -> ChildOutcome:
    """Verify the case of `request` in a child process, killed with its process group after `timeout_s` s.

    `request` holds op, impl, dims, dtype, seed, seeds, regimes (a list), initial_state, mode (None: the impl's
    default), device, imports, deterministic and reference."""
    with tempfile.TemporaryDirectory(prefix="deltabench-verify-") as tmp:
        request_path, result_path, log_path = (Path(tmp) / n for n in ("request.json", "result.pkl", "log.txt"))
        request_path.write_text(json.dumps(request))
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "deltabench.correctness.verify_child", str(request_path), str(result_path)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a timeout kills whatever the kernel started, too
            )
            timed_out = False
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_group(proc)
            except BaseException:  # Ctrl-C: leave no orphan behind
                _kill_group(proc)
                raise
        log_text = log_path.read_text(errors="replace")
        phase = _last_phase(log_text)
        if not timed_out and result_path.exists():
            result = pickle.loads(result_path.read_bytes())
            return ChildOutcome(phase=phase, **result)
    outcome = ChildOutcome(phase=phase, timed_out=timed_out)
    if timed_out:
        outcome.crash = f"hung in {phase}: no result after {timeout_s:g} s (--timeout); process group killed"
        return outcome
    rc = proc.returncode
    if rc < 0:
        try:
            outcome.signal = signal.Signals(-rc).name
        except ValueError:
            outcome.signal = str(-rc)
        how = f"killed by signal {outcome.signal}"
        if outcome.signal == "SIGKILL":
            how += " (the system's out-of-memory killer?)"
    else:
        how = f"exited with code {rc}"
    outcome.crash = f"crashed in {phase}: {how}"
    tail = _log_tail(log_text)
    if tail:
        outcome.crash += f" [log: {tail}]"
    return outcome


if __name__ == "__main__":
    sys.exit(main())
