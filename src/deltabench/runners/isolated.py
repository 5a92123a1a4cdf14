"""Runs jobs in processes of their own with a timeout, so that a crash, a hang or an out-of-memory error
ends that job (with its status and message) and the run goes on.

Two strategies, both behind the one-method runner interface:

* :class:`SharedProcessRunner` (``isolation = "impl"``, the default of ``deltabench run``): the jobs of one
  (op, impl, device) run one after another in one long-lived worker process, which pays the impl's import,
  compilation and autotuning once. A job that times out, crashes, runs out of memory or fails ends that
  process (it may have left the device or the impl in a bad state); the job gets its status and a fresh
  process takes the next job.
* :class:`IsolatedRunner` / :func:`run_isolated` (``isolation = "job"``): one fresh process per job, for
  kernels that leak state from one call to the next.

By default a process is forked from a multiprocessing fork server that has imported torch and the
harness once (a job then starts in milliseconds rather than seconds); with ``python=`` it is
``python -m deltabench.runners.job_main`` under that interpreter. Either way it runs in a new session (its
own process group): on timeout the whole group is killed, whatever the subject spawned. A job whose
process dies without writing a result (a segfault, ``os._exit``, the kernel's OOM killer) ends ``failed``
with the signal or exit code and the tail of its log.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Mapping
from pathlib import Path

from deltabench.harness.cases import has_backward
from deltabench.harness.devices import DEVICE_SHARE_ENV
from deltabench.harness.document import GATE_ONLY, JobResult
from deltabench.harness.errors import crash_words
from deltabench.harness.suites import ISOLATIONS

from .base import JobSpec
from .environment import job_environment
from .job import PHASE_MARK, case_spec, parse_phase_mark

__all__ = ["IsolatedRunner", "SharedProcessRunner", "make_runner", "run_gates", "run_isolated"]

_LOG_TAIL = 600  # characters of the child's log quoted in a failure's reason
_POLL_S = 0.02  # how often a waiting parent looks for the result, the process and new phase marks
# A worker goes on to the next job only after these; any other status may have left it in a bad state.
_REUSABLE = frozenset({"ok", "incorrect", "unsupported"})
_context: multiprocessing.context.BaseContext | None = None


def _forkserver() -> multiprocessing.context.BaseContext:
    global _context
    if _context is None:
        from .job_main import PRELOAD

        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(PRELOAD)
    return _context


def _job_payload(job: JobSpec) -> dict:
    """`job` as its process reads it. ``stage`` is left out when it is the default: a worker under an older
    deltabench (the base tree of ``deltabench run --base-ref``) knows no such field and rejects unknown ones."""
    data = job.model_dump()
    if data.get("stage") == "all":
        del data["stage"]
    if not data.get("compile_cases"):
        del data["compile_cases"]
    return data


def _log_tail(log: str) -> str:
    """The crash's own words (the crashing frame, as ``verify`` quotes it), else the log's last lines."""
    return crash_words([ln for ln in log.splitlines() if not ln.startswith(PHASE_MARK)], _LOG_TAIL)


def _phases(log: str) -> list[tuple[str, float | None]]:
    return [parse_phase_mark(ln) for ln in log.splitlines() if ln.startswith(PHASE_MARK)]


def _last_phase(log: str) -> str:
    phases = _phases(log)
    return phases[-1][0] if phases else "startup"


def _phase_times(log: str, now: float) -> str:
    """The job's last phase with how long it had run by `now` and how long each phase before it took, e.g.
    ``timing for 12 s, after setup 3 s, first call 1 s, gate 350 s, memory 30 s`` (the last phase's name alone
    where the marks carry no times)."""
    phases = _phases(log)
    starts = [at for _, at in phases if at is not None]
    if not phases or len(starts) < len(phases):
        return _last_phase(log)
    names = [name for name, _ in phases]
    ends = [*starts[1:], now]
    spans = [f"{name} {end - start:.0f} s" for name, start, end in zip(names, starts, ends, strict=True)]
    text = f"{names[-1]} for {ends[-1] - starts[-1]:.0f} s"
    return text + (", after " + ", ".join(spans[:-1]) if len(spans) > 1 else "")


def _kill_group(pid: int, fallback) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        fallback()


def _run_forked(
    payload: dict, log_path: Path, timeout_s: float, stop: threading.Event | None = None
) -> tuple[bool, int]:
    """(timed_out, exit code) of the job run in a process forked from the fork server; `stop` set (by another
    thread) ends it as a timeout."""
    proc = _forkserver().Process(target=_child, args=(json.dumps(payload), str(log_path)), daemon=False)
    proc.start()
    try:
        if stop is None:
            proc.join(timeout_s)
        else:
            deadline = time.monotonic() + timeout_s
            while proc.exitcode is None and not stop.is_set() and time.monotonic() < deadline:
                proc.join(min(0.1, max(deadline - time.monotonic(), 0.0)))
    except BaseException:
        _kill_group(proc.pid, proc.kill)  # interrupted: leave no orphan behind
        proc.join()
        raise
    if proc.exitcode is None:
        _kill_group(proc.pid, proc.kill)
        proc.join()
        return True, proc.exitcode or 0
    return False, proc.exitcode


def _child(payload_json: str, log_path: str) -> None:
    from .job_main import child_main

    child_main(payload_json, log_path)


def _run_exec(
    payload: dict, log_path: Path, timeout_s: float, python: str, stop: threading.Event | None = None
) -> tuple[bool, int]:
    """(timed_out, exit code) of the job run as ``python -m deltabench.runners.job_main``; `stop` set (by another
    thread) ends it as a timeout."""
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [python, "-m", "deltabench.runners.job_main"],
            stdin=subprocess.PIPE,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            text=True,
            env=payload["env"],
        )
        try:
            try:
                proc.stdin.write(json.dumps(payload))
                proc.stdin.close()
            except BrokenPipeError:
                pass  # the child died before reading its job: reported from its exit code
            if stop is None:
                proc.wait(timeout=timeout_s)
            else:
                deadline = time.monotonic() + timeout_s
                while proc.poll() is None and not stop.is_set():
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise subprocess.TimeoutExpired(proc.args, timeout_s)
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(timeout=min(0.1, left))
                if proc.poll() is None:
                    raise subprocess.TimeoutExpired(proc.args, timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid, proc.kill)
            proc.wait()
            return True, proc.returncode
        except BaseException:
            _kill_group(proc.pid, proc.kill)
            proc.wait()
            raise
    return False, proc.returncode


def _lost_result(job: JobSpec, started: _dt.datetime, *, timed_out: bool, rc: int, log_text: str) -> JobResult:
    """The result of a job whose process gave none: ``timeout``, or ``failed`` with its signal or exit code,
    the phase it was in and the tail of its log."""
    case = job.to_case()
    result = JobResult(
        job_id=job.job_id,
        attempt=job.attempt,
        case=case_spec(case),
        impl=job.impl,
        device=case.device,
        status="failed",
        started_at=started,
        finished_at=_dt.datetime.now(_dt.timezone.utc),
    )
    phase = _last_phase(log_text)
    if timed_out:
        result.status = "timeout"
        where = _phase_times(log_text, time.time())
        result.reason = f"no result after {job.timeout_s:g} s (in {where}); process group killed"
    else:
        if rc < 0:
            try:
                how = f"killed by signal {signal.Signals(-rc).name}"
            except ValueError:
                how = f"killed by signal {-rc}"
        else:
            how = f"exited with code {rc}"
        result.reason = f"crashed in {phase}: {how} without a result"
    tail = _log_tail(log_text)
    if tail:
        result.reason += f" [log: {tail}]"
    return result


def _read_result(path: Path, job: JobSpec) -> JobResult:
    """The result a job's process wrote to `path`."""
    # A gate-only job that passed is 'ok' without its timing, which the run makes later.
    context = {GATE_ONLY: True} if job.stage in ("gate", "compile") else None
    return JobResult.model_validate_json(path.read_text(), context=context)


def run_isolated(
    job: JobSpec,
    *,
    python: str | None = None,
    env: Mapping[str, str] | None = None,
    stop: threading.Event | None = None,
) -> JobResult:
    """Run `job` in a fresh process, killing its process group after ``job.timeout_s`` seconds.

    With `python` (an interpreter path) the job is started under it; otherwise it is forked from the
    fork server. `env`: variables set for the job over this process's (:func:`job_environment`). `stop`: an
    event by which another thread ends the job early (a run interrupted while jobs run in threads of its own,
    :func:`run_gates`); the job then ends as a timeout.
    """
    started = _dt.datetime.now(_dt.timezone.utc)
    with tempfile.TemporaryDirectory(prefix="deltabench-job-") as tmp:
        result_path = Path(tmp) / "result.json"
        log_path = Path(tmp) / "log.txt"
        payload = {"job": _job_payload(job), "result_path": str(result_path), "env": job_environment(env)}
        if python:
            timed_out, rc = _run_exec(payload, log_path, job.timeout_s, python, stop)
        else:
            timed_out, rc = _run_forked(payload, log_path, job.timeout_s, stop)
        log_text = log_path.read_text(errors="replace") if log_path.exists() else ""
        if not timed_out and result_path.exists():
            return _read_result(result_path, job)
    return _lost_result(job, started, timed_out=timed_out, rc=rc, log_text=log_text)


PhaseCallback = Callable[[JobSpec, str], None]


class _Worker:
    """One long-lived process that runs the jobs it is sent, one at a time (see :class:`SharedProcessRunner`)."""

    def __init__(self, python: str | None, extra_env: Mapping[str, str] | None = None) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="deltabench-worker-")
        self.dir = Path(self._tmp.name)
        self.log_path = self.dir / "log.txt"
        self.log_path.touch()
        self.jobs_done = 0
        env = job_environment(extra_env)
        if python:
            self._log = open(self.log_path, "w")  # noqa: SIM115 - open for the process's whole life
            self._popen: subprocess.Popen | None = subprocess.Popen(
                [python, "-m", "deltabench.runners.job_main", "--serve"],
                stdin=subprocess.PIPE,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                text=True,
                env=env,
            )
            self._proc = None
            self._send_end = None
            self.pid = self._popen.pid
        else:
            from .job_main import serve_main

            ctx = _forkserver()
            receive_end, self._send_end = ctx.Pipe(duplex=False)
            self._proc = ctx.Process(target=serve_main, args=(receive_end, str(self.log_path), env), daemon=False)
            self._proc.start()
            receive_end.close()
            self._popen = None
            self.pid = self._proc.pid

    def exit_code(self) -> int | None:
        """The process's exit code (negative: the signal), None while it runs."""
        return self._popen.poll() if self._popen is not None else self._proc.exitcode

    def _send(self, payload: dict) -> None:
        try:
            if self._popen is not None:
                self._popen.stdin.write(json.dumps(payload) + "\n")
                self._popen.stdin.flush()
            else:
                self._send_end.send(json.dumps(payload))
        except (BrokenPipeError, OSError):
            pass  # the process is gone: its exit code says how

    def run(self, job: JobSpec, on_phase: PhaseCallback | None) -> tuple[JobResult | None, bool, int, str]:
        """Run `job`: (its result or None, timed out, exit code, the log it wrote)."""
        result_path = self.dir / f"result-{self.jobs_done}.json"
        self.jobs_done += 1
        start_at = self.log_path.stat().st_size
        self._send({"job": _job_payload(job), "result_path": str(result_path)})
        deadline = time.monotonic() + job.timeout_s
        seen, phase = start_at, None
        try:
            while True:
                # Marks first: a job's last phases are in the log before its result file appears.
                if on_phase is not None and self.log_path.stat().st_size > seen:
                    lines = self._read_from(seen)
                    lines = lines[: lines.rfind(b"\n") + 1]  # whole lines only: a mark may be half written
                    seen += len(lines)
                    marks = [ln for ln in lines.decode(errors="replace").splitlines() if ln.startswith(PHASE_MARK)]
                    for mark in marks:  # every phase, in order: a short one may share a poll with the next
                        if mark != phase:
                            phase = mark
                            on_phase(job, parse_phase_mark(phase)[0])
                if result_path.exists():
                    result = _read_result(result_path, job)
                    result_path.unlink()
                    return result, False, 0, self._log_since(start_at)
                rc = self.exit_code()
                if rc is not None:
                    if result_path.exists():  # written just before the process ended
                        continue
                    return None, False, rc, self._log_since(start_at)
                if time.monotonic() > deadline:
                    self.kill()
                    return None, True, self.exit_code() or 0, self._log_since(start_at)
                time.sleep(_POLL_S)
        except BaseException:
            self.kill()  # interrupted: leave no orphan behind
            raise

    def _read_from(self, offset: int) -> bytes:
        with open(self.log_path, "rb") as f:
            f.seek(offset)
            return f.read()

    def _log_since(self, offset: int) -> str:
        return self._read_from(offset).decode(errors="replace")

    def kill(self) -> None:
        """End the process and everything it started, now."""
        if self._popen is not None:
            _kill_group(self._popen.pid, self._popen.kill)
            self._popen.wait()
        else:
            _kill_group(self._proc.pid, self._proc.kill)
            self._proc.join()

    def close(self) -> None:
        """End the process and everything its jobs started, and clean up. It is idle (its last result was read),
        so nothing is lost: killing it saves the second or so an interpreter with torch and JAX takes to exit."""
        if self._popen is not None:
            with contextlib.suppress(OSError):
                self._popen.stdin.close()
            self.kill()
            self._log.close()
        else:
            self._send_end.close()
            self.kill()
        self._tmp.cleanup()


class SharedProcessRunner:
    """Runs the jobs of one (op, impl, device) one after another in one long-lived process, with each job's
    timeout; a timeout, a crash or a status other than ok / incorrect / unsupported ends that process and
    the next job gets a fresh one. A job of another impl closes the current process first (one process at a
    time holds the device). `env`: variables set in its processes over this one's. Call :meth:`close` at the end
    (or use it as a context manager).
    """

    def __init__(
        self,
        python: str | None = None,
        on_phase: PhaseCallback | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.python = python
        self.on_phase = on_phase
        self.env = dict(env or {})
        self.processes_started = 0
        self._worker: _Worker | None = None
        self._key: tuple | None = None

    def run(self, job: JobSpec) -> JobResult:
        """Run `job` in the current worker of its impl, starting one when there is none."""
        case = job.to_case()
        key = (case.op, job.impl, case.device, tuple(job.imports))
        if self._worker is not None and (key != self._key or self._worker.exit_code() is not None):
            self.close()
        if self._worker is None:
            self._worker, self._key = _Worker(self.python, self.env), key
            self.processes_started += 1
        started = _dt.datetime.now(_dt.timezone.utc)
        result, timed_out, rc, log_text = self._worker.run(job, self.on_phase)
        if result is None:
            self.close()
            return _lost_result(job, started, timed_out=timed_out, rc=rc, log_text=log_text)
        if result.status not in _REUSABLE:
            self.close()
        return result

    def kill(self) -> None:
        """End the current worker's process now, from any thread: the job it is running ends as lost (crashed)
        and :meth:`run` returns."""
        worker = self._worker
        if worker is not None:
            worker.kill()

    def close(self) -> None:
        """End the current worker process, if any."""
        if self._worker is not None:
            worker, self._worker, self._key = self._worker, None, None
            worker.close()

    def __enter__(self) -> SharedProcessRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def make_runner(
    isolation: str = "impl",
    *,
    python: str | None = None,
    on_phase: PhaseCallback | None = None,
    env: Mapping[str, str] | None = None,
) -> SharedProcessRunner | IsolatedRunner:
    """The runner for a suite's `isolation`: ``"impl"`` (one worker process per impl, reporting each job's phases
    to `on_phase`) or ``"job"`` (a fresh process per job; no phases); `env` is set in its processes."""
    if isolation == "job":
        return IsolatedRunner(python=python, env=env)
    if isolation == "impl":
        return SharedProcessRunner(python=python, on_phase=on_phase, env=env)
    raise ValueError(f"unknown isolation {isolation!r}: use one of {', '.join(ISOLATIONS)}")


class IsolatedRunner:
    """Runs each job in its own process with the job's timeout (forked, or under `python` if given)."""

    def __init__(self, python: str | None = None, env: Mapping[str, str] | None = None) -> None:
        self.python = python
        self.env = dict(env or {})

    def run(self, job: JobSpec) -> JobResult:
        """Run `job` in a fresh process."""
        return run_isolated(job, python=self.python, env=self.env)


def _gate_runner(python: str | None, env: Mapping[str, str] | None) -> SharedProcessRunner:
    """The runner of one impl's gates in :func:`run_gates`: one long-lived process for all of them (a fresh one
    after a crash or a timeout), so that the impl's imports, compiles and the gate's reduced-case records
    (correctness/gate_memo.py) are made once, as in a run that gates job by job."""
    return SharedProcessRunner(python=python, env=env)


def _compiles(jobs: Mapping[int, JobSpec], keys: list[int]) -> bool:
    """Whether the chain of `keys` is a compile (:func:`run_gates`: a compile-stage job is a chain of its own)."""
    return jobs[keys[0]].stage == "compile"


def _mode_rank(job: JobSpec) -> int:
    """0 for a gate that runs a backward (its calls build the forward's kernels too), 1 for a forward-only one."""
    return 0 if has_backward(job.to_case().mode) else 1


def _split_chains(
    chains: list[list[int]], jobs: Mapping[int, JobSpec], workers: int, autotuned: Collection[int] = ()
) -> list[list[int]]:
    """`chains` (each impl's gates, one process each) split until there are `workers` of them, where places would
    otherwise stay empty: the chain with the most gates is halved, keeping together the gates that share reduced
    cases (the same impl, dims but B and T, dtype and mode: correctness/gate_memo.py reuses their records within a
    process; of the longest, the one with the most families first), until every chain holds one gate. A compile is
    never split; a chain holding a key of `autotuned` (an impl that autotunes) only between tuning groups (the
    same dims but B and T, and dtype, whatever the mode: a group's forward gate finds what its forward+backward gate
    tuned); no chain is joined."""
    chains = [list(keys) for keys in chains]

    def tuned(keys: list[int]) -> bool:
        return any(k in autotuned for k in keys)

    while len(chains) < workers:
        splittable = [
            keys
            for keys in chains
            if len(keys) > 1
            and not _compiles(jobs, keys)
            and (not tuned(keys) or len(_families(keys, jobs, modes=False)) > 1)
        ]
        if not splittable:
            break
        longest = max(splittable, key=lambda keys: (len(keys), len(_families(keys, jobs))))
        chains.remove(longest)
        chains += _halves(longest, jobs, modes=not tuned(longest))
    return chains


def _families(
    keys: list[int], jobs: Mapping[int, JobSpec], *, modes: bool = True
) -> dict[tuple[object, ...], list[int]]:
    """`keys` by the reduced cases their gates share: the case's dims but B and T, its dtype and (with `modes`) its
    mode; without, an autotuning impl's tuning groups."""
    families: dict[tuple[object, ...], list[int]] = {}
    for key in keys:
        case = jobs[key].to_case()
        dims = tuple((n, d) for n, d in case.dims.items() if n not in ("B", "T"))
        families.setdefault((dims, case.dtype, case.mode if modes else None), []).append(key)
    return families


def _halves(keys: list[int], jobs: Mapping[int, JobSpec], *, modes: bool = True) -> list[list[int]]:
    """`keys` in two chains, each in the order given: whole families of gates (:func:`_families`, by `modes`), the
    largest first into the shorter chain; one family alone is cut in alternate gates."""
    families = _families(keys, jobs, modes=modes)
    if len(families) == 1:
        return [keys[0::2], keys[1::2]]
    a: list[int] = []
    b: list[int] = []
    for family in sorted(families.values(), key=len, reverse=True):
        (a if len(a) <= len(b) else b).extend(family)
    return [sorted(a, key=keys.index), sorted(b, key=keys.index)]


def _gate_stage(job: JobSpec) -> JobSpec:
    """`job` as :func:`run_gates` runs it: its compile stage where that is its stage, its gate otherwise."""
    return job if job.stage == "compile" else job.model_copy(update={"stage": "gate"})


def _gate_allocators(given: Mapping[str, str]) -> dict[str, str]:
    """The allocator settings a gate process gets, each unless the user chose its own (in `given`).

    A gate holds an impl's buffers and PyTorch's float32 reference in one process, the reference's backward sized
    to half the memory free when it is decided (correctness/oracle.py): JAX's pool would keep what a JAX impl's
    largest call took from the reference that follows it (the platform allocator gives each buffer back when it
    dies), and PyTorch's caching allocator can strand tens of GiB between a reference's large blocks
    (expandable segments grow and reuse one mapping instead: 26.5 GiB reserved but unallocated when jax_chunk's
    fwd+bwd gate at B4-T8192-H16 ran out of memory on the H200). Gates are not timed: slower allocations cost
    nothing that is measured."""
    chosen: dict[str, str] = {}
    if "XLA_PYTHON_CLIENT_ALLOCATOR" not in given:
        chosen["XLA_PYTHON_CLIENT_ALLOCATOR"] = "platform"
    if not any(n in given for n in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")):
        chosen["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    return chosen


def run_gates(
    jobs: Mapping[int, JobSpec],
    workers: int,
    *,
    python: str | None = None,
    env: Mapping[str, str] | None = None,
    on_gated: Callable[[int, JobResult], None] | None = None,
    own_process: Collection[int] = (),
    after_compiles: Collection[int] = (),
    autotuned: Collection[int] = (),
    on_again: Callable[[int, JobResult], None] | None = None,
) -> dict[int, JobResult]:
    """The gates of `jobs` (key: any index): ``ok`` when it passed, else the status and reason its job ends with.
    Each impl's gates run one after another in one process of their own (:func:`_gate_runner`: a crash or a timeout
    costs its own job, the next gets a fresh process; those with a backward first), up to `workers` such chains at
    once, an impl's chain split
    in two (and again) while fewer chains than `workers` would leave places empty (:func:`_split_chains`; one
    holding a key of `autotuned`, an impl that autotunes, only between its tuning groups); a job
    whose key is in `own_process` (an impl that compiles each shape, ``Impl.compiles_per_shape``) is a chain of its
    own, so that its compiles overlap those of the impl's other jobs. Chains side by side are told their share of
    the device (``DELTABENCH_DEVICE_SHARE`` = 1 / the chains at once), which bounds what a gate sizes by the free
    device memory (its fwd+bwd reference length on a GPU, correctness/oracle.py) and what its allocators hold. A gate
    that ran out of memory beside others is run again once all the others have ended, alone and with the whole
    device: its job ends ``oom`` only when it does so alone too (the others' allocations are not its fault);
    `on_again` (key, that first result) hears of each such gate as it is put back.
    `on_gated` (key, result) is called, in this thread, as each ends. Interrupted (Ctrl-C, SIGTERM), it kills the
    gates still running before it lets the exception through. A job of ``stage = "compile"`` (``JobSpec.stage``)
    runs that stage, any other its gate; the chains of the keys in `after_compiles` start once every compile has
    ended, and the compiles start after the other chains have taken their places."""
    import queue
    from concurrent.futures import ThreadPoolExecutor

    if python is None:
        _forkserver()  # made once here: the threads then share it
    by_impl: dict[tuple[str, int], list[int]] = {}  # by impl (or impl and job), in the order given
    for key, job in jobs.items():
        by_impl.setdefault((job.impl, key if key in own_process else -1), []).append(key)
    # Within a chain the gates with a backward first: their calls compile and autotune the forward's kernels too,
    # which the forward-only gates after then find done (FLA's forward gate: 84 s first, seconds after).
    by_impl = {impl: sorted(keys, key=lambda k: _mode_rank(jobs[k])) for impl, keys in by_impl.items()}
    chains = _split_chains(list(by_impl.values()), jobs, workers, autotuned)
    side_by_side = min(workers, len(chains))
    waiting = [keys for keys in chains if any(k in after_compiles for k in keys)]
    # The gates first: the compiles then fill the places left, so no gate waits behind a compile for a place.
    now = sorted((keys for keys in chains if keys not in waiting), key=lambda ks: _compiles(jobs, ks))
    given = {**os.environ, **(env or {})}
    env = {**(env or {}), **_gate_allocators(given)}
    alone_env = env
    if side_by_side > 1:
        # Chains side by side share the device: each sizes what it may allocate for itself by this share, and each
        # process's allocators are held to it (PyTorch's by keep_to_share in the job, JAX's by XLA's memory
        # fraction, its growth limit when it does not preallocate) unless the user set XLA's fraction (by either
        # name: JAX refuses both at once).
        share = f"{1 / side_by_side:.6g}"
        set_by_user = any(n in given for n in ("XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION"))
        env = {**(env or {}), DEVICE_SHARE_ENV: share, **({} if set_by_user else {"XLA_CLIENT_MEM_FRACTION": share})}
    stop = threading.Event()
    runners: list[SharedProcessRunner] = []
    ended: queue.Queue[tuple[int, JobResult | None]] = queue.Queue()  # (key, result); None: a chain's end

    def chain(keys: list[int], chain_env: Mapping[str, str] | None) -> None:
        runner = _gate_runner(python, chain_env)
        runners.append(runner)
        try:
            for key in keys:
                if stop.is_set():
                    break
                ended.put((key, runner.run(_gate_stage(jobs[key]))))
        finally:
            runner.close()
            ended.put((keys[0], None))

    results: dict[int, JobResult] = {}
    again: list[int] = []  # out of memory beside others: to run alone at the end

    def collect(chains_running: int, alone: bool) -> None:
        compiling = sum(_compiles(jobs, keys) for keys in now) if not alone else 0
        while True:
            if waiting and not compiling:
                for keys in waiting:
                    pool.submit(chain, keys, env)
                chains_running += len(waiting)
                waiting.clear()
            if not chains_running:
                return
            key, result = ended.get()
            if result is None:
                chains_running -= 1
                compiling -= _compiles(jobs, [key]) if not alone else 0
            elif side_by_side > 1 and not alone and result.status == "oom" and jobs[key].stage != "compile":
                again.append(key)
                if on_again is not None:
                    on_again(key, result)
            else:
                results[key] = result
                if on_gated is not None:
                    on_gated(key, result)

    pool = ThreadPoolExecutor(max_workers=max(1, side_by_side), thread_name_prefix="deltabench-gate")
    try:
        for keys in now:
            pool.submit(chain, keys, env)
        collect(len(now), alone=False)
        for key in again:  # each alone, in the order they ran out
            pool.submit(chain, [key], alone_env)
            collect(1, alone=True)
    except BaseException:
        stop.set()  # no chain starts another gate
        for runner in list(runners):
            runner.kill()  # the gate each is running ends now, as lost
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return results


if __name__ == "__main__":  # pragma: no cover
    sys.exit("deltabench.runners.isolated is a library; use `deltabench run`")
