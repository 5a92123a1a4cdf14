"""Peak memory and time of GDN-2's jax_chunk on JAX's CPU backend: one jitted forward and one forward+backward.

Each (shape, mode) runs in its own subprocess so that its peak resident memory (``ru_maxrss``) is its own. The time
is the median of `--reps` calls after a warm-up call; the compile is timed apart. bf16 inputs (g float32), as the
GPU suites feed it::

    .venv/bin/python benchmarks/cpu/gdn2_jax_chunk_mem.py [--shapes 1x1024x2,1x4096x6] [--kv 128] [--reps 3]

Prints one line per (shape, mode): peak RSS (MiB), compile (s), median call (ms).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys


def child(B: int, T: int, H: int, KV: int, mode: str, reps: int) -> dict[str, float]:
    """Measure one (shape, mode) in this process; returns peak RSS (MiB), compile (s) and median call (ms)."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import resource
    import statistics
    import time

    import jax
    import jax.numpy as jnp

    from deltabench.kernels.gdn2.jax.jax_chunk import chunk_gdn2_jax
    from deltabench.references import gdn2

    t = gdn2.make_inputs(B, T, H, KV, KV, seed=0)
    x = {n: jnp.asarray(a.numpy()) if n == "g" else jnp.asarray(a.numpy()).astype(jnp.bfloat16) for n, a in t.items()}
    args = tuple(x[n] for n in ("q", "k", "v", "g", "b", "w"))
    if mode == "fwd":
        fn = jax.jit(lambda *a: chunk_gdn2_jax(*a)[0])
    else:
        do = jnp.ones((B, T, H, KV), jnp.bfloat16)

        def loss(*a):
            return jnp.sum(chunk_gdn2_jax(*a)[0].astype(jnp.float32) * do)

        fn = jax.jit(jax.grad(loss, argnums=tuple(range(6))))
    start = time.perf_counter()
    compiled = fn.lower(*args).compile()
    compile_s = time.perf_counter() - start
    jax.block_until_ready(compiled(*args))  # warm-up
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append((time.perf_counter() - start) * 1e3)
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    return {"peak_mib": peak_mib, "compile_s": compile_s, "ms": statistics.median(times)}


def main() -> None:
    """Run every (shape, mode) in a subprocess and print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="1x1024x2,1x4096x6", help="BxTxH, comma-separated")
    ap.add_argument("--kv", type=int, default=128, help="K = V")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    opts = ap.parse_args()
    if opts.child:
        B, T, H, mode = opts.child.split(":")
        print(json.dumps(child(int(B), int(T), int(H), opts.kv, mode, opts.reps)))
        return
    for shape in opts.shapes.split(","):
        B, T, H = (int(s) for s in shape.split("x"))
        for mode in ("fwd", "fwd+bwd"):
            cmd = [sys.executable, __file__, "--kv", str(opts.kv), "--reps", str(opts.reps), "--child"]
            proc = subprocess.run([*cmd, f"{B}:{T}:{H}:{mode}"], capture_output=True, text=True)
            if proc.returncode != 0:
                tail = (proc.stderr.strip().splitlines() or ["?"])[-1][:200]
                print(f"B{B} T{T} H{H} K=V={opts.kv} {mode:8s} failed (rc {proc.returncode}): {tail}", flush=True)
                continue
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            print(
                f"B{B} T{T} H{H} K=V={opts.kv} {mode:8s} peak {r['peak_mib']:8.0f} MiB  "
                f"compile {r['compile_s']:6.2f} s  call {r['ms']:9.1f} ms",
                flush=True,
            )


if __name__ == "__main__":
    main()
