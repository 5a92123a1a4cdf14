"""How deltabench's JAX kernels get compiled: a persistent compilation cache, and an opt-in cheap CPU compiler.

* **Persistent cache** (on by default). deltabench runs every job in a fresh process, so without a cache each
  job recompiles the same programs: seconds each on a CPU, more for a forward+backward on a GPU. Compiled
  programs are kept in ``$DELTABENCH_JAX_CACHE_DIR`` (default ``$XDG_CACHE_HOME/deltabench/jax``, that is
  ``~/.cache/deltabench/jax``); ``DELTABENCH_JAX_CACHE_DIR=off`` disables it, and a cache directory already set
  in JAX's own configuration is left alone. A program loaded from the cache reports its loading time as
  ``compile_s``.
* **Cheap compiles** (``DELTABENCH_JAX_FAST_COMPILE=1``, off by default). XLA's CPU compiler then uses its
  classic loop emitters and LLVM at ``-O0``: about ten times cheaper compiles, slower code. Meant for
  correctness work on a CPU (tests, smoke runs), never for timings that matter: the LLVM setting also applies to
  GPU code generation. The flags are probed in a subprocess first (XLA aborts on a flag it does not know), and
  apply only if JAX has not started a backend yet in this process.
* **No YNN fusions on the CPU** (always, unless ``XLA_FLAGS`` names the option). jaxlib 0.10's XLA:CPU fuses
  some programs into YNN kernels, one of which segfaults the process in a transpose (``slinky`` /
  ``make_transpose_impl`` on an XLA worker thread): gdn2 ``jax_chunk``'s backward at T = 65 and 130 on an AMD EPYC
  host, every time. :data:`SAFE_CPU_FLAGS` turns them off (``xla_cpu_experimental_ynn_fusion_type`` empty) for
  every program, when this XLA knows the option (probed as above).
* **Cheap programs on request** (:func:`cheap_cpu_compile_options`). The same settings as per-program compiler
  options, so that one process can compile some programs cheaply and others as usual: the runner's correctness
  gate compiles the programs it needs beyond those the job times this way on the CPU (see
  ``jax_bridge.cheap_compiles``).
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

import jax

__all__ = [
    "FAST_CPU_COMPILE_FLAGS",
    "SAFE_CPU_FLAGS",
    "avoid_cpu_crashes",
    "cheap_cpu_compile_options",
    "configure_compilation",
    "enable_persistent_cache",
    "use_fast_cpu_compilation",
]

FAST_CPU_COMPILE_FLAGS = (
    "--xla_cpu_use_fusion_emitters=false",
    "--xla_backend_optimization_level=0",
    "--xla_llvm_disable_expensive_passes=true",
)
SAFE_CPU_FLAGS = ("--xla_cpu_experimental_ynn_fusion_type=",)  # the module docstring says why
_CACHE_MIN_COMPILE_S = 0.25  # smaller programs compile faster than a cache lookup pays back
# "<jax version>:<0|1>" per flag set, so that child processes skip the probe
_PROBED_ENV = "DELTABENCH_JAX_FAST_COMPILE_PROBED"
_SAFE_PROBED_ENV = "DELTABENCH_JAX_SAFE_FLAGS_PROBED"


def enable_persistent_cache() -> str | None:
    """Point JAX's persistent compilation cache at deltabench's directory; returns it, or None when disabled."""
    wanted = os.environ.get("DELTABENCH_JAX_CACHE_DIR", "")
    if wanted.lower() in ("off", "0", "none", "false"):
        return None
    current = getattr(jax.config, "jax_compilation_cache_dir", None)
    if current:
        return str(current)
    if not wanted:
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        wanted = str(Path(base) / "deltabench" / "jax")
    try:
        jax.config.update("jax_compilation_cache_dir", wanted)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", _CACHE_MIN_COMPILE_S)
    except (AttributeError, KeyError, ValueError):  # a JAX without these options: compile every time
        return None
    return wanted


def _xla_accepts(flags: tuple[str, ...], probed_env: str = _PROBED_ENV) -> bool:
    """Whether this XLA starts with `flags` (checked in a subprocess: an unknown flag aborts the process); the
    answer is kept in the environment variable `probed_env` for this process and its children."""
    version = jax.__version__
    seen = os.environ.get(probed_env, "")
    if seen.startswith(version + ":"):
        return seen.endswith(":1")
    env = {**os.environ, "XLA_FLAGS": " ".join(flags), "JAX_PLATFORMS": "cpu"}
    try:
        probe = subprocess.run(
            [sys.executable, "-c", "import jax; jax.devices()"], env=env, capture_output=True, timeout=120
        )
        ok = probe.returncode == 0
    except (OSError, subprocess.SubprocessError):
        ok = False
    os.environ[probed_env] = f"{version}:{int(ok)}"
    return ok


def avoid_cpu_crashes() -> bool:
    """Add :data:`SAFE_CPU_FLAGS` to ``XLA_FLAGS`` where the user set none of their options and this XLA knows
    them; returns whether they are in effect. Call it before JAX's first computation in the process."""
    current = os.environ.get("XLA_FLAGS", "").split()
    named = {f.split("=", 1)[0] for f in current}
    missing = tuple(f for f in SAFE_CPU_FLAGS if f.split("=", 1)[0] not in named)
    if not missing:
        return all(f in current for f in SAFE_CPU_FLAGS)
    if not _xla_accepts(missing, _SAFE_PROBED_ENV):
        return False
    os.environ["XLA_FLAGS"] = " ".join([*current, *missing])
    return True


def use_fast_cpu_compilation() -> bool:
    """Add :data:`FAST_CPU_COMPILE_FLAGS` to ``XLA_FLAGS`` when this XLA knows them; returns whether it did.

    Call it before JAX's first computation in the process (XLA reads its flags when the backend starts).
    """
    current = os.environ.get("XLA_FLAGS", "").split()
    missing = tuple(f for f in FAST_CPU_COMPILE_FLAGS if f not in current)
    if not missing:
        return True
    if not _xla_accepts(FAST_CPU_COMPILE_FLAGS):
        return False
    os.environ["XLA_FLAGS"] = " ".join([*current, *missing])
    return True


def _option_value(text: str) -> bool | int | str:
    if text in ("true", "false"):
        return text == "true"
    return int(text) if text.lstrip("-").isdigit() else text


@functools.cache
def cheap_cpu_compile_options() -> dict[str, bool | int | str] | None:
    """:data:`FAST_CPU_COMPILE_FLAGS` as compiler options for one program (``jax.jit(f, compiler_options=...)``),
    or None when this XLA refuses them (checked once per process, on a one-line program)."""
    options = {}
    for flag in FAST_CPU_COMPILE_FLAGS:
        name, _, value = flag.removeprefix("--").partition("=")
        options[name] = _option_value(value)
    try:
        one = jax.device_put(jax.numpy.float32(1.0), jax.devices("cpu")[0])
        jax.jit(lambda x: x + 1, compiler_options=options)(one).block_until_ready()
    except Exception:  # an XLA without these options (or without per-program options): compile as usual
        return None
    return options


def configure_compilation() -> None:
    """Apply deltabench's compilation settings from the environment (see the module docstring)."""
    avoid_cpu_crashes()
    if os.environ.get("DELTABENCH_JAX_FAST_COMPILE", "") == "1":
        use_fast_cpu_compilation()
    enable_persistent_cache()
