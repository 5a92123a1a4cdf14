"""The environment fingerprint stored with every run: where and with what it was measured.

Versions come from package metadata (``importlib.metadata``): asking for JAX's or Triton's version never
imports them. The git commit and dirty flag are those of the deltabench source tree when it is a git
checkout; the kernel hash covers ``kernels/**/*.py`` so that a changed kernel is a different series.
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import socket
import subprocess
from collections.abc import Mapping
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from deltabench.harness.document import Environment

__all__ = [
    "collect_environment",
    "compile_caches",
    "git_state",
    "job_environment",
    "kernel_hash",
    "machine_kind",
    "nvidia_smi_query",
    "source_root",
]

_VENDOR_WORDS = {"nvidia", "geforce", "tesla", "amd", "radeon", "instinct", "intel"}


def source_root() -> Path:
    """The folder holding deltabench's top-level packages (harness/, kernels/, ...)."""
    import deltabench.harness

    return Path(deltabench.harness.__file__).resolve().parent.parent


def _pkg_version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def machine_kind(device_name: str) -> str:
    """A short lowercase device class: ``"NVIDIA H200"`` -> ``"h200"``, ``"NVIDIA A100-SXM4-80GB"`` -> ``"a100"``."""
    tokens = [t for t in re.split(r"[\s\-_]+", device_name.lower()) if t and t not in _VENDOR_WORDS]
    kind: list[str] = []
    for tok in tokens:
        kind.append(tok)
        if any(c.isdigit() for c in tok):
            break
    return "".join(kind) or "unknown"


def tpu_machine_kind(device_kind: str) -> str:
    """The machine kind of a TPU from JAX's ``device_kind``: ``"TPU v5 lite"`` -> ``"tpu-v5e"``, ``"TPU v5e"``
    -> ``"tpu-v5e"``, ``"TPU v6 lite"`` -> ``"tpu-v6e"``, ``"TPU v5"`` -> ``"tpu-v5p"``, ``"TPU v4"`` -> ``"tpu-v4"``.

    Google sells the ``lite`` chips as the ``e`` generations and the v5 full chip as v5p; the kind names the chip
    as its users know it, so that runs on one TPU generation compare with each other only.
    """
    words = device_kind.lower().replace("tpu", " ").split()
    if not words:
        return "tpu"
    version = words[0]
    rest = words[1:]
    if rest[:1] == ["lite"]:
        version, rest = version + "e", rest[1:]
    elif version == "v5" and not rest:
        version = "v5p"
    return "-".join(["tpu", version, *rest])


def _tpu() -> tuple[str, int] | None:
    """(device_kind, count) of the TPUs JAX sees, or None when it sees none (or JAX is not installed)."""
    from deltabench.harness.devices import absent_reason

    if absent_reason("tpu"):
        return None
    import jax

    devices = jax.devices("tpu")
    return str(devices[0].device_kind), len(devices)


def git_state(root: Path | None = None) -> tuple[str | None, bool]:
    """(commit, dirty) of the deltabench source tree, or (None, False) when it is not a git checkout.

    A copy without ``.git`` (a tree shipped to a GPU host) can name its commit in ``DELTABENCH_GIT_COMMIT``.
    """
    root = root or source_root()
    if os.environ.get("DELTABENCH_GIT_COMMIT"):
        return os.environ["DELTABENCH_GIT_COMMIT"], False

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()

    try:
        top = Path(git("rev-parse", "--show-toplevel")).resolve()
        if top != root.resolve():
            return None, False  # installed inside some other repository: its commit says nothing of ours
        return git("rev-parse", "HEAD"), bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return None, False


# Every kernel source kind: Python, and CUDA/C++ sources a kernel may compile (a change to any of them is a new kernel).
KERNEL_SOURCE_SUFFIXES = (".py", ".cu", ".cuh", ".cpp", ".h", ".hpp")


def job_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a job runs with: this process's with `extra` over it, JAX not grabbing most of the GPU up
    front (a job may hold torch and JAX buffers side by side), and Triton keeping autotuning results in its on-disk
    cache beside the compiled kernels, so a later process or run does not tune the same kernel again (a user's
    ``TRITON_CACHE_AUTOTUNING=0`` still wins)."""
    env = {**os.environ, **(extra or {})}
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    env.setdefault("TRITON_CACHE_AUTOTUNING", "1")
    return env


def kernel_hash(root: Path | None = None) -> str | None:
    """SHA-256 (first 16 hex digits) over the paths and contents of every source file under ``kernels/``
    (:data:`KERNEL_SOURCE_SUFFIXES`)."""
    base = (root or source_root()) / "kernels"
    if not base.is_dir():
        return None
    h = hashlib.sha256()
    for path in sorted(p for p in base.rglob("*") if p.suffix in KERNEL_SOURCE_SUFFIXES and p.is_file()):
        if "__pycache__" in path.parts:
            continue
        h.update(path.relative_to(base).as_posix().encode())
        h.update(b"\0")
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def nvidia_smi_query(field: str) -> list[str]:
    """One ``nvidia-smi --query-gpu`` field, a value per GPU (empty without nvidia-smi or GPUs; never imports torch)."""
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def _nvidia_driver() -> str | None:
    drivers = nvidia_smi_query("driver_version")
    return drivers[0] if drivers else None


def _cache_state(path: Path) -> str:
    try:
        entries = sum(1 for _ in path.iterdir())
    except OSError:
        return f"{path} (absent)"
    return f"{path} ({entries} entries)" if entries else f"{path} (empty)"


def compile_caches(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Where compiled kernels and the gate's references persist between runs, each with how many entries it
    holds (``absent`` or ``empty``: a cold start), by the rules a job process with environment `env` (default:
    what :func:`job_environment` gives it) follows; imports none of the tools.

    Triton: ``$TRITON_CACHE_DIR``, else ``$TRITON_HOME/.triton/cache`` (home by default), and whether its
    autotuning results are cached too; TileLang: ``$TILELANG_CACHE_DIR``, else ``~/.tilelang/cache``; JAX: the
    persistent cache kernels/common/jax/jax_compile.py enables (``off`` when disabled); references:
    correctness/reference_cache.py.
    """
    from deltabench.correctness.reference_cache import cache_dir as reference_cache_dir

    if env is None:
        env = job_environment()
    home = Path.home()
    xdg = Path(env.get("XDG_CACHE_HOME") or home / ".cache")
    triton = env.get("TRITON_CACHE_DIR") or str(Path(env.get("TRITON_HOME") or home) / ".triton" / "cache")
    tuned = "autotuning cached" if env.get("TRITON_CACHE_AUTOTUNING", "0") not in ("", "0") else "autotuning not cached"
    tilelang = env.get("TILELANG_CACHE_DIR") or str(home / ".tilelang" / "cache")
    jax_wanted = env.get("DELTABENCH_JAX_CACHE_DIR", "")
    if jax_wanted.lower() in ("off", "0", "none", "false"):
        jax = None
    else:
        jax = env.get("JAX_COMPILATION_CACHE_DIR") or jax_wanted or str(xdg / "deltabench" / "jax")
    references = reference_cache_dir()
    return {
        "cache.triton": f"{_cache_state(Path(triton))}, {tuned}",
        "cache.tilelang": _cache_state(Path(tilelang)),
        "cache.jax": _cache_state(Path(jax)) if jax else "off",
        "cache.references": _cache_state(references) if references else "off",
    }


def collect_environment(device: str = "cpu") -> Environment:
    """The fingerprint of this machine for a run on `device` (``cpu``, ``cuda`` or ``tpu``): the accelerator the
    jobs use, named by itself (``machine_kind`` ``h200`` from the GPU's name, ``tpu-v5e`` from the TPU's
    ``device_kind``); the host CPU where the device is the CPU or is absent (every job then ends unsupported)."""
    from deltabench.harness.devices import parse_device

    wanted = parse_device(device).platform
    tpu = _tpu() if wanted == "tpu" else None
    import torch

    from deltabench.harness.version import __version__

    commit, dirty = git_state()
    cpu = _cpu_name()
    if tpu is not None:
        name, count = tpu
        kind, driver, cuda, extra = tpu_machine_kind(name), None, None, {"jax_platform": "tpu"}
    elif wanted == "cuda" and torch.cuda.is_available():
        name = torch.cuda.get_device_name(0)
        count = torch.cuda.device_count()
        kind = machine_kind(name)
        driver, cuda = _nvidia_driver(), torch.version.cuda
        cap = torch.cuda.get_device_capability(0)
        extra = {"compute_capability": f"sm_{cap[0]}{cap[1]}"}
        from .hwstate import clock_lock_note

        if note := clock_lock_note():  # `run --lock-clocks`: locked, or why not
            extra["clocks"] = note
    else:
        name, count, kind, driver, cuda, extra = cpu, 1, "cpu", None, None, {}
        extra["threads"] = str(torch.get_num_threads())
    extra.update(compile_caches())
    return Environment(
        host=socket.gethostname(),
        machine_kind=kind,
        device_name=name,
        device_count=count,
        platform=platform.platform(),
        cpu=cpu,
        python=platform.python_version(),
        driver=driver,
        cuda=cuda,
        torch=_pkg_version("torch"),
        triton=_pkg_version("triton"),
        jax=_pkg_version("jax"),
        deltabench=__version__,
        git_commit=commit,
        git_dirty=dirty,
        kernel_hash=kernel_hash(),
        extra=extra,
    )
