"""GDN-2 in JAX on a GPU: deltabench's Pallas kernel (where its body lowers), jax_chunk and atomic-ops' chunked WY,
checked then timed in one process. A diagnostic script: the gated, stored tables come from ``deltabench run``.

Run on the GPU host (JAX with CUDA)::

    python benchmarks/gpu/gdn2_pallas.py [--shape B=8,T=4096,H=6,K=128,V=128] [--dtype bf16] [--reps 20]

For each path: (1) can it lower and compile for the GPU (if not, the reason is printed and the path is skipped);
(2) a check at a small shape (B1 T200 H2 K=V=128) against deltabench's float64 oracle (o, the final state and
every gradient, relative Frobenius error); (3) at the timed shape, o and the gradients against jax_chunk in
float32; (4) times: compile (lower + compile, apart), then the median of `--reps` calls of the forward and of the
forward+backward (the gradient of ``sum(o * do)`` w.r.t. q, k, v, g, b, w), each call synchronised
(``block_until_ready``), after warm-up. The Pallas kernel is written for the TPU (Mosaic: ``pltpu`` scratch and
compiler parameters), so on a GPU its compiled path is expected to fail to lower; ``--interpret`` also checks its
body through Pallas' interpreter on the GPU (XLA operations: correct, not fast, so it is not timed).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import traceback

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


def parse_shape(text: str) -> dict[str, int]:
    """``B=8,T=4096,H=6,K=128,V=128`` -> a dict (V defaults to K)."""
    dims = {k.strip(): int(v) for k, v in (part.split("=") for part in text.split(","))}
    dims.setdefault("V", dims["K"])
    return dims


def first_line(exc: BaseException) -> str:
    """The exception's type and the first line of its message."""
    msg = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {msg[0] if msg else ''}"[:300]


def make_inputs(dims: dict[str, int], dtype, seed: int = 0):
    """deltabench's seeded gdn2 inputs (torch, CPU) and the same values as JAX arrays of `dtype` (g stays f32)."""
    import jax.numpy as jnp
    from deltabench.references import gdn2

    t = gdn2.make_inputs(dims["B"], dims["T"], dims["H"], dims["K"], dims["V"], seed=seed, initial_state=True)
    arrays = {}
    for name, x in t.items():
        a = jnp.asarray(x.numpy())
        arrays[name] = a if name in ("g", "initial_state") else a.astype(dtype)
    return t, arrays


ARGS = ("q", "k", "v", "g", "b", "w")


def paths(interpret: bool):
    """name -> ``core(q, k, v, g, b, w, initial_state=None) -> (o, final_state)`` (pure JAX), or an import error."""
    out = {}
    from deltabench.kernels.gdn2.jax.jax_chunk import chunk_gdn2_jax

    out["jax_chunk"] = lambda *a, initial_state=None: chunk_gdn2_jax(*a, initial_state=initial_state)
    try:
        from deltabench.kernels.gdn2.jax.pallas.chunk import chunk_gdn2_pallas

        out["pallas_chunk"] = lambda *a, initial_state=None: chunk_gdn2_pallas(
            *a, initial_state=initial_state, interpret=False
        )
        if interpret:
            out["pallas_chunk (interpreter)"] = lambda *a, initial_state=None: chunk_gdn2_pallas(
                *a, initial_state=initial_state, interpret=True
            )
    except Exception as exc:  # an older JAX without the Pallas TPU module
        out["pallas_chunk"] = exc
    try:
        from deltabench.kernels.external.atomic_ops import gdn2_atomic_wy

        out["atomic_ops_wy"] = lambda *a, initial_state=None: gdn2_atomic_wy(*a, initial_state=initial_state)
    except Exception as exc:
        out["atomic_ops_wy"] = exc
    return out


def fwd_and_train(core):
    """Jitted forward ``(args, h0) -> (o, state)`` and training step ``(args, h0, do) -> (o, grads)``."""
    import jax
    import jax.numpy as jnp

    fwd = jax.jit(lambda args, h0: core(*args, initial_state=h0))

    def loss(args, h0, do):
        o, _ = core(*args, initial_state=h0)
        return jnp.sum(o.astype(jnp.float32) * do.astype(jnp.float32)), o

    train = jax.jit(lambda args, h0, do: jax.grad(loss, has_aux=True)(args, h0, do)[::-1])
    return fwd, train


def rel_err(got, want) -> float:
    import numpy as np

    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


def check_against_oracle(core, dtype, T: int) -> float:
    """The worst relative error of o, the final state and every gradient at B1 T200 H2 K=V=128 vs the float64 oracle.

    (`T` = 200 for the chunk-64 paths; atomic-ops' chunked path needs T % 256 == 0: 256 there.)
    """
    import jax.numpy as jnp
    import numpy as np
    import torch
    from deltabench.references import gdn2

    t, a = make_inputs({"B": 1, "T": T, "H": 2, "K": 128, "V": 128}, dtype, seed=1)
    do = torch.randn(1, T, 2, 128, generator=torch.Generator().manual_seed(2))
    leaves = {n: t[n].double().requires_grad_(True) for n in (*ARGS, "initial_state")}
    o_ref, s_ref = gdn2.gdn2_recurrent(*(leaves[n] for n in ARGS), initial_state=leaves["initial_state"])
    grads_ref = torch.autograd.grad((o_ref * do.double()).sum(), [leaves[n] for n in ARGS])
    fwd, train = fwd_and_train(core)
    args = tuple(a[n] for n in ARGS)
    o, s = fwd(args, a["initial_state"])
    _, grads = train(args, a["initial_state"], jnp.asarray(do.numpy()).astype(dtype))
    errs = [rel_err(o, o_ref.detach().numpy()), rel_err(s, s_ref.detach().numpy())]
    errs += [rel_err(np.asarray(gr, np.float32), ref.numpy()) for gr, ref in zip(grads, grads_ref, strict=True)]
    return max(errs)


def timed(fn, reps: int) -> float:
    """Median milliseconds of `reps` synchronised calls after warm-up (until two calls agree within 10%)."""
    import jax

    last = None
    for _ in range(20):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        dt = time.perf_counter() - t0
        if last is not None and abs(dt - last) <= 0.1 * last:
            break
        last = dt
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


def run_path(name: str, core, args, h0, do, dtype, reference, reps: int, backend: str) -> dict[str, str]:
    """Compile, check and time one path; a row of the table (with the reason where a step could not run)."""
    row = {"impl": name, "fwd": "", "train": "", "compile": "", "oracle": "", "vs_jax_chunk": "", "note": ""}
    if isinstance(core, Exception):
        row["note"] = f"not importable: {first_line(core)}"
        return row
    fwd, train = fwd_and_train(core)
    try:
        t0 = time.perf_counter()
        fwd_c = fwd.lower(args, h0).compile()
        t1 = time.perf_counter()
        train_c = train.lower(args, h0, do).compile()
        t2 = time.perf_counter()
        row["compile"] = f"{t1 - t0:.1f} / {t2 - t1:.1f}"
    except Exception as exc:
        row["note"] = f"does not lower/compile for {backend}: {first_line(exc)}"
        if os.environ.get("DELTABENCH_TRACEBACK"):
            traceback.print_exc()
        return row
    try:
        row["oracle"] = f"{check_against_oracle(core, dtype, 256 if name.startswith('atomic') else 200):.1e}"
    except Exception as exc:
        row["note"] = f"oracle check failed to run: {first_line(exc)}"
    if "interpreter" in name:
        row["note"] = row["note"] or "interpreter: checked only, not timed"
        return row
    try:
        o, grads = train_c(args, h0, do)
        errs = [rel_err(o, reference[0])] + [rel_err(g_, r_) for g_, r_ in zip(grads, reference[1], strict=True)]
        row["vs_jax_chunk"] = f"{max(errs):.1e}"
        row["fwd"] = f"{timed(lambda: fwd_c(args, h0), reps):.3f}"
        row["train"] = f"{timed(lambda: train_c(args, h0, do), reps):.3f}"
    except Exception as exc:
        row["note"] = f"failed while running: {first_line(exc)}"
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="B=8,T=4096,H=6,K=128,V=128")
    parser.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"))
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--interpret", action="store_true", help="also check the Pallas body in the interpreter")
    parser.add_argument("--allow-cpu", action="store_true", help="run on JAX's CPU backend (plumbing only)")
    opts = parser.parse_args(argv)

    import jax
    import jax.numpy as jnp

    backend = jax.default_backend()
    print(f"jax {jax.__version__}, backend {backend}, devices {[d.device_kind for d in jax.devices()]}")
    if backend != "gpu" and not opts.allow_cpu:
        print("no GPU visible to JAX (install jax[cuda12] or jax[cuda13]); --allow-cpu runs the plumbing on the CPU")
        return 2
    dims = parse_shape(opts.shape)
    dtype = jnp.bfloat16 if opts.dtype == "bf16" else jnp.float32
    _, a = make_inputs(dims, dtype)
    args = tuple(a[n] for n in ARGS)
    h0 = a["initial_state"]
    do = jax.random.normal(jax.random.PRNGKey(0), (dims["B"], dims["T"], dims["H"], dims["V"])).astype(dtype)
    shape_id = "B{B} T{T} H{H} K{K} V{V}".format(**dims)

    # the fp32 reference at the timed shape: jax_chunk's o and gradients from float32 inputs
    ref_core = paths(False)["jax_chunk"]
    reference = fwd_and_train(ref_core)[1](tuple(x.astype(jnp.float32) for x in args), h0, do.astype(jnp.float32))
    rows = []
    for name, core in paths(opts.interpret).items():
        rows.append(run_path(name, core, args, h0, do, dtype, reference, opts.reps, backend))

    print(f"\nGDN-2, {opts.dtype}, {shape_id}, with an initial state; ms are medians of {opts.reps} synchronised calls")
    print("oracle: worst rel. error of o, state and every gradient vs float64 at B1 T200 H2 d128 (atomic-ops: T256)")
    print("vs_jax_chunk: worst rel. error of o and every gradient vs jax_chunk in fp32 at the timed shape\n")
    header = ("impl", "fwd ms", "fwd+bwd ms", "compile s (fwd / fwd+bwd)", "oracle", "vs_jax_chunk", "note")
    keys = ("impl", "fwd", "train", "compile", "oracle", "vs_jax_chunk", "note")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(str(row[k]) for k in keys) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
