"""One impl call replayed in a fresh interpreter: the cross-process half of the gate's determinism check.

Two calls in one process share every cache a kernel may consult (compiled programs, autotuning picks, allocator
state, lazily built tables); a kernel whose bits depend on one of them can agree with itself within a process and
differ in the next. :func:`replay_in_fresh_process` saves the very inputs (and cotangents) of a gated call to a
temporary file, starts ``python -m deltabench.correctness.fresh_process REQUEST``, which imports deltabench anew (and
the ``--import`` modules), looks the impl up by its registered name and makes the same call through the gate's own
:func:`~deltabench.correctness.calls.call_impl`, and reads back every output and gradient. The child inherits the
environment (``TRITON_INTERPRET`` included), so it runs the kernel as the gate did.
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from deltabench.harness.errors import is_out_of_memory

__all__ = ["ReplayFailed", "main", "replay_in_fresh_process"]

TIMEOUT_S = 600.0  # a fresh process compiles the impl's kernels again (Triton's on-disk cache usually holds them)


class ReplayFailed(RuntimeError):
    """The fresh process did not return the call's tensors (it raised, crashed or timed out); the message says
    which, with the end of its log."""


def replay_in_fresh_process(
    op: str,
    impl: str,
    inputs: dict[str, Any],
    cotangents: tuple[torch.Tensor, torch.Tensor] | None,
    *,
    scale: float | None,
    device: str = "cpu",
    imports: list[str] | tuple[str, ...] = (),
    timeout_s: float = TIMEOUT_S,
) -> dict[str, torch.Tensor | None]:
    """Call impl `impl` of `op` on `inputs` (and back-propagate `cotangents`) in a new Python process; returns what
    ``_Run.tensors()`` holds there (``o``, ``final_state``, ``grad:<input>``), on the CPU. `device` is the case's
    (a JAX impl computes there).

    Raises:
        torch.OutOfMemoryError: the child's call ran out of memory (the device may be shared; no verdict on bits).
        ReplayFailed: the child raised otherwise, crashed or ran past `timeout_s`.
    """
    with tempfile.TemporaryDirectory(prefix="deltabench-replay-") as tmp:
        call_path, result_path, log_path = (Path(tmp) / n for n in ("call.pt", "result.pt", "log.txt"))
        torch.save({"inputs": inputs, "cotangents": cotangents, "scale": scale}, call_path)
        # The child needs the device memory this process's allocator keeps cached from the gate's references (on
        # the H200, 138 of 140 GiB at sdm's flagship shape): given back before the child starts.
        gc.collect()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.empty_cache()
        request = {
            "op": op,
            "impl": impl,
            "device": device,
            "imports": list(imports),
            "call": str(call_path),
            "result": str(result_path),
        }
        with open(log_path, "wb") as log:
            try:
                proc = subprocess.run(
                    [sys.executable, "-m", "deltabench.correctness.fresh_process", json.dumps(request)],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    timeout=timeout_s,
                    check=False,
                )
            except subprocess.TimeoutExpired:
                raise ReplayFailed(f"the fresh process ran past {timeout_s:g} s") from None
        log_text = log_path.read_text(errors="replace")
        tail = " | ".join(ln.strip() for ln in log_text.splitlines()[-3:] if ln.strip())
        if proc.returncode != 0 and is_out_of_memory(tail):
            raise torch.OutOfMemoryError(f"in the gate's fresh-process replay: {tail}")
        if proc.returncode != 0 or not result_path.exists():
            raise ReplayFailed(f"the fresh process exited with code {proc.returncode}" + (f" [{tail}]" if tail else ""))
        result = torch.load(result_path, weights_only=True)
    if result.get("oom"):
        # out of memory says nothing of the kernel's bits: the job ends oom, as it would have in its own process
        raise torch.OutOfMemoryError(f"in the gate's fresh-process replay: {result['error']}")
    if "error" in result:
        raise ReplayFailed(f"the impl raised in the fresh process: {result['error']}")
    return result["tensors"]


def _replay(request: dict[str, Any]) -> dict[str, Any]:
    """The child's work: the imports, the impl by name, the saved call through the gate's ``call_impl``."""
    from deltabench.harness.devices import placement
    from deltabench.harness.ops import get_op
    from deltabench.harness.registry import get_impl, load_module

    from .calls import call_impl

    for module in request["imports"]:
        load_module(module)
    fn = get_impl(request["op"], request["impl"])
    try:
        call = torch.load(request["call"], weights_only=True)  # onto the device the gate's tensors were on
        with placement(request["device"], fn.backend):
            run = call_impl(fn, get_op(request["op"]), call["inputs"], call["cotangents"], scale=call["scale"])
    except Exception as exc:  # the impl raised: the parent reports it as a failed replay, or as out of memory
        error = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
        return {"error": error, "oom": is_out_of_memory(exc)}
    tensors = {n: t.detach().cpu() if isinstance(t, torch.Tensor) else None for n, t in run.tensors().items()}
    return {"tensors": tensors}


def main(argv: list[str] | None = None) -> int:
    """Child entry point: one JSON argument (op, impl, imports, call and result paths)."""
    request = json.loads((argv or sys.argv[1:])[0])
    torch.save(_replay(request), request["result"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
