"""GDN-2 in JAX on a GPU: deltabench's Pallas kernels for a GPU (``pallas_gpu_chunk``, Triton) in their tilings,
the TPU Pallas kernel (where its body lowers), jax_chunk, atomic-ops' chunked WY and FLA's ``chunk_gdn2`` (PyTorch,
when installed), checked then timed in one process. A diagnostic script: the gated, stored tables come from
``deltabench run`` (suite ``gdn2-gpu``).

Run on the GPU host (JAX with CUDA)::

    python benchmarks/gpu/gdn2_pallas.py [--shape B=8,T=4096,H=6,K=128,V=128] [--dtype bf16] [--reps 20]
        [--block-v 128,64] [--dots fp32,bf16x3,bf16] [--warps 4] [--num-stages 1] [--grads-warps 8] [--walk-warps 8]
        [--no-fla] [--stages]

For each path: (1) can it lower and compile for the GPU (if not, the reason is printed and the path is skipped);
(2) a check at a small shape (B1 T200 H2 K=V=128) against deltabench's float64 oracle (o, the final state and
every gradient, relative Frobenius error); (3) at the timed shape, o and the gradients against jax_chunk in
float32; (4) times: compile (lower + compile, apart; for FLA the first calls, Triton's JIT and autotuning), then
the median of `--reps` calls of the forward and of the forward+backward (the gradient of ``sum(o * do)`` w.r.t. q,
k, v, g, b, w), each call synchronised, after warm-up. ``pallas_gpu_chunk`` runs once per tiling: value columns per
program (``--block-v``; 128 = all of V at d = 128), products (``--dots``: IEEE float32, three bf16 tensor-core
passes, or one on operands rounded to bf16), Triton warps (``--warps``; ``--grads-warps``: the gradient kernel's
own, ``--walk-warps`` the walks') and pipelining depth (``--num-stages``). The TPU kernel (``pallas_chunk``) is
Mosaic code: on a GPU its compiled path is expected to fail to lower; ``--interpret`` also checks both Pallas
bodies in Pallas' interpreter (XLA operations: correct, not fast, so it is not timed). ``--stages`` times
``pallas_gpu_chunk``'s kernels one by one (prepare, walk, the cotangent's walk, the gradients), tiling by tiling:
where its time goes.
"""

from __future__ import annotations

import argparse
import functools
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


def paths(interpret: bool, tilings: list[dict] | None = None):
    """name -> ``core(q, k, v, g, b, w, initial_state=None) -> (o, final_state)`` (pure JAX), or an import error.

    `tilings`: the ``pallas_gpu_chunk`` options to run, one path each (default: its defaults only).
    """
    out = {}
    from deltabench.kernels.gdn2.jax.jax_chunk import chunk_gdn2_jax

    out["jax_chunk"] = lambda *a, initial_state=None: chunk_gdn2_jax(*a, initial_state=initial_state)
    try:
        from deltabench.kernels.gdn2.jax.pallas.gpu_chunk import chunk_gdn2_pallas_gpu

        for options in tilings or [{}]:
            label = ", ".join(f"{k}={v}" for k, v in options.items())
            out[f"pallas_gpu_chunk ({label})" if label else "pallas_gpu_chunk"] = functools.partial(
                chunk_gdn2_pallas_gpu, interpret=False, **options
            )
        if interpret:
            out["pallas_gpu_chunk (interpreter)"] = functools.partial(chunk_gdn2_pallas_gpu, interpret=True)
    except Exception as exc:  # an older JAX without Pallas' Triton module
        out["pallas_gpu_chunk"] = exc
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


def tilings(
    block_v: str, dots: str, warps: str, V: int, num_stages: str = "1", grads_warps: str = "", walk_warps: str = ""
) -> list[dict]:
    """The cross product of the ``pallas_gpu_chunk`` options given as comma lists (block_v >= V: all of V;
    `grads_warps`, `walk_warps` empty: those kernels at ``pallas_gpu_chunk``'s defaults)."""
    import itertools

    axes = [
        [("block_v", None if int(x) >= V else int(x)) for x in block_v.split(",")],
        [("dots", d) for d in dots.split(",")],
        [("num_warps", int(x)) for x in warps.split(",")],
        [("num_stages", int(x)) for x in num_stages.split(",")],
        [("grads_warps", int(x)) for x in grads_warps.split(",") if x] or [()],
        [("walk_warps", int(x)) for x in walk_warps.split(",") if x] or [()],
    ]
    return [dict(item for item in combo if item) for combo in itertools.product(*axes)]


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


def timed(fn, reps: int, sync=None) -> float:
    """Median milliseconds of `reps` synchronised calls after warm-up (until two calls agree within 10%).

    `sync(result)` waits for the call's work (default ``jax.block_until_ready``; torch: ``cuda.synchronize``).
    """
    import jax

    sync = sync or jax.block_until_ready
    last = None
    for _ in range(20):
        t0 = time.perf_counter()
        sync(fn())
        dt = time.perf_counter() - t0
        if last is not None and abs(dt - last) <= 0.1 * last:
            break
        last = dt
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        sync(fn())
        samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


def fla_train(fn, tensors: dict, do):
    """FLA's forward and the gradients of ``sum(o * do)`` w.r.t. q, k, v, g, b, w (torch, on the GPU)."""
    import torch

    leaves = {n: tensors[n].detach().requires_grad_(True) for n in ARGS}
    o, _ = fn(*(leaves[n] for n in ARGS), initial_state=tensors["initial_state"])
    grads = torch.autograd.grad((o.float() * do.float()).sum(), [leaves[n] for n in ARGS])
    return o, grads


def run_fla(dtype_name: str, dims: dict[str, int], do_np, reference, reps: int) -> dict[str, str]:
    """FLA's Triton ``chunk_gdn2`` through deltabench's adapter, at the same inputs, a row of the same table."""
    row = {"impl": "fla_chunk (torch)", "fwd": "", "train": "", "compile": "", "oracle": "", "vs_jax_chunk": ""}
    row["note"] = ""
    try:
        import torch

        from deltabench.kernels.external.fla import gdn2_fla_chunk
        from deltabench.references import gdn2

        if not torch.cuda.is_available():
            row["note"] = "torch sees no CUDA device"
            return row
        tdt = torch.bfloat16 if dtype_name == "bf16" else torch.float32

        def on_gpu(t: dict) -> dict:
            return {n: x.cuda().to(tdt if n not in ("g", "initial_state") else x.dtype) for n, x in t.items()}

        def sync(_):
            torch.cuda.synchronize()

        x = on_gpu(gdn2.make_inputs(dims["B"], dims["T"], dims["H"], dims["K"], dims["V"], seed=0, initial_state=True))
        do = torch.from_numpy(do_np).cuda().to(tdt)
        t0 = time.perf_counter()
        sync(gdn2_fla_chunk(*(x[n] for n in ARGS), initial_state=x["initial_state"]))
        t1 = time.perf_counter()
        sync(fla_train(gdn2_fla_chunk, x, do))
        t2 = time.perf_counter()
        row["compile"] = f"{t1 - t0:.1f} / {t2 - t1:.1f} (first calls)"

        small = gdn2.make_inputs(1, 200, 2, 128, 128, seed=1, initial_state=True)
        do_small = torch.randn(1, 200, 2, 128, generator=torch.Generator().manual_seed(2))
        leaves = {n: small[n].double().requires_grad_(True) for n in (*ARGS, "initial_state")}
        o_ref, s_ref = gdn2.gdn2_recurrent(*(leaves[n] for n in ARGS), initial_state=leaves["initial_state"])
        grads_ref = torch.autograd.grad((o_ref * do_small.double()).sum(), [leaves[n] for n in ARGS])
        xs = on_gpu(small)
        o_s, s_s = gdn2_fla_chunk(*(xs[n] for n in ARGS), initial_state=xs["initial_state"])
        _, grads = fla_train(gdn2_fla_chunk, xs, do_small.cuda().to(tdt))
        errs = [
            rel_err(o_s.detach().float().cpu(), o_ref.detach()),
            rel_err(s_s.detach().float().cpu(), s_ref.detach()),
        ]
        errs += [rel_err(gr.float().cpu(), ref) for gr, ref in zip(grads, grads_ref, strict=True)]
        row["oracle"] = f"{max(errs):.1e}"

        o, grads = fla_train(gdn2_fla_chunk, x, do)
        errs = [rel_err(o.detach().float().cpu(), reference[0])]
        errs += [rel_err(gr.float().cpu(), ref) for gr, ref in zip(grads, reference[1], strict=True)]
        row["vs_jax_chunk"] = f"{max(errs):.1e}"
        row["fwd"] = (
            f"{timed(lambda: gdn2_fla_chunk(*(x[n] for n in ARGS), initial_state=x['initial_state']), reps, sync):.3f}"
        )
        row["train"] = f"{timed(lambda: fla_train(gdn2_fla_chunk, x, do), reps, sync):.3f}"
    except Exception as exc:
        row["note"] = f"FLA path did not run: {first_line(exc)}"
        if os.environ.get("DELTABENCH_TRACEBACK"):
            traceback.print_exc()
    return row


def step(name: str, what: str) -> None:
    """One progress line on stderr: where a path is (a run cut by its caller's limit shows the step it was in)."""
    print(f"  {time.strftime('%H:%M:%S')} {name}: {what}", file=sys.stderr, flush=True)


def run_path(name: str, core, args, h0, do, dtype, reference, reps: int, backend: str) -> dict[str, str]:
    """Compile, check and time one path; a row of the table (with the reason where a step could not run)."""
    row = {"impl": name, "fwd": "", "train": "", "compile": "", "oracle": "", "vs_jax_chunk": "", "note": ""}
    if isinstance(core, Exception):
        row["note"] = f"not importable: {first_line(core)}"
        return row
    fwd, train = fwd_and_train(core)
    try:
        step(name, "compiling the forward")
        t0 = time.perf_counter()
        fwd_c = fwd.lower(args, h0).compile()
        t1 = time.perf_counter()
        row["compile"] = f"{t1 - t0:.1f} / -"
        if "interpreter" not in name:
            # the forward's time first: a backward that never finishes compiling still leaves the forward's figure
            step(name, f"forward compiled in {t1 - t0:.1f} s; timing it")
            row["fwd"] = f"{timed(lambda: fwd_c(args, h0), reps):.3f}"
        step(name, f"forward {row['fwd'] or 'not timed'} ms; compiling the training step")
        t2 = time.perf_counter()
        train_c = train.lower(args, h0, do).compile()
        t3 = time.perf_counter()
        row["compile"] = f"{t1 - t0:.1f} / {t3 - t2:.1f}"
        step(name, f"training step compiled in {t3 - t2:.1f} s")
    except Exception as exc:
        row["note"] = f"does not lower/compile/run for {backend}: {first_line(exc)}"
        if os.environ.get("DELTABENCH_TRACEBACK"):
            traceback.print_exc()
        return row
    step(name, "checking against the float64 oracle at B1 T200 H2")
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
        row["train"] = f"{timed(lambda: train_c(args, h0, do), reps):.3f}"
    except Exception as exc:
        row["note"] = f"failed while running: {first_line(exc)}"
    return row


def stage_times(args, h0, do, tiling: dict, reps: int, interpret: bool = False) -> dict[str, float]:
    """Milliseconds of each Pallas GPU kernel at the timed shape, one `tiling` of ``pallas_gpu_chunk``: the prepare
    alone, the forward (prepare, walk, states stored), the cotangent's walk alone, the whole backward; the walk and
    the gradient kernel are the differences. `interpret`: Pallas' interpreter (the plumbing on a CPU)."""
    import jax
    import jax.numpy as jnp

    from deltabench.kernels.gdn2.jax.pallas import gpu, gpu_chunk

    q = args[0]
    options = {"chunk": 64, "dots": tiling.get("dots", "fp32")}
    options.update(num_warps=tiling.get("num_warps", 4), num_stages=tiling.get("num_stages", 1))
    options["interpret"] = interpret
    # what pallas_gpu_chunk runs when the tiling leaves them out: its defaults
    walk_options = {
        **options,
        "block_v": tiling.get("block_v", gpu_chunk.BLOCK_V),
        "walk_warps": tiling.get("walk_warps", gpu_chunk.WALK_WARPS),
    }
    scale = q.shape[-1] ** -0.5
    h0_t = jnp.swapaxes(h0.astype(jnp.float32), -1, -2)
    d_final_t = jnp.zeros_like(h0_t)
    _, _, states_t, prepared = gpu.gdn2_gpu_forward(*args, h0_t, scale=scale, store_states=True, **walk_options)
    jax.block_until_ready(prepared)
    backward = functools.partial(
        gpu.gdn2_gpu_backward, *args, do, states_t, d_final_t, prepared, scale=scale,
        grads_warps=tiling.get("grads_warps", gpu_chunk.GRADS_WARPS),
    )  # fmt: skip
    out = {
        "prepare": timed(lambda: gpu.gdn2_gpu_prepare(*args, **options), reps),
        "forward": timed(
            lambda: gpu.gdn2_gpu_forward(*args, h0_t, scale=scale, store_states=True, **walk_options), reps
        ),
        "dstate walk": timed(lambda: backward(dstate_only=True, **walk_options), reps),
        "backward": timed(lambda: backward(**walk_options), reps),
    }
    out["walk"] = out["forward"] - out["prepare"]
    out["gradients"] = out["backward"] - out["dstate walk"]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="B=8,T=4096,H=6,K=128,V=128")
    parser.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"))
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--interpret", action="store_true", help="also check the Pallas body in the interpreter")
    parser.add_argument("--allow-cpu", action="store_true", help="run on JAX's CPU backend (plumbing only)")
    parser.add_argument("--block-v", default="128,64", help="pallas_gpu_chunk: value columns a program (comma list)")
    parser.add_argument("--dots", default="fp32,bf16x3", help="pallas_gpu_chunk: products, fp32, bf16x3 and/or bf16")
    parser.add_argument("--warps", default="4", help="pallas_gpu_chunk: Triton warps a program (comma list)")
    parser.add_argument("--num-stages", default="1", help="pallas_gpu_chunk: Triton pipelining depth (comma list)")
    parser.add_argument(
        "--grads-warps",
        default="",
        help="pallas_gpu_chunk: the gradient kernel's own warps (comma list; default: pallas_gpu_chunk's)",
    )
    parser.add_argument(
        "--walk-warps", default="", help="pallas_gpu_chunk: the walks' own warps (comma list; default: its default)"
    )
    parser.add_argument("--no-fla", action="store_true", help="leave out FLA's chunk_gdn2 (PyTorch)")
    parser.add_argument("--stages", action="store_true", help="also time each Pallas GPU kernel, tiling by tiling")
    opts = parser.parse_args(argv)
    if opts.allow_cpu:
        # jaxlib 0.10's CPU backend segfaults in a YNNPACK transpose of jax_chunk's training step at the oracle's
        # shape (B1 T200 H2 d128) after the timed shape's calls: its library fusions off, before JAX starts
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_experimental_ynn_fusion_type=").strip()

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
    started = time.perf_counter()

    def done(row: dict[str, str]) -> None:
        """Keep `row` and print it at once: a run cut by its caller's time limit keeps the paths it finished."""
        rows.append(row)
        print(f"[{time.perf_counter() - started:.0f} s] " + " | ".join(str(v) for v in row.values()), flush=True)

    chosen = tilings(opts.block_v, opts.dots, opts.warps, dims["V"], opts.num_stages, opts.grads_warps, opts.walk_warps)
    for name, core in paths(opts.interpret, chosen).items():
        done(run_path(name, core, args, h0, do, dtype, reference, opts.reps, backend))
    stages = {}
    for tiling in chosen if opts.stages else []:
        label = ", ".join(f"{k}={v}" for k, v in tiling.items())
        step(f"stages ({label})", "timing each kernel")
        try:
            stages[label] = stage_times(args, h0, do, tiling, opts.reps, interpret=backend != "gpu")
            print(f"stages ({label}): " + ", ".join(f"{k} {v:.3f} ms" for k, v in stages[label].items()), flush=True)
        except Exception as exc:
            print(f"stages ({label}): did not run: {first_line(exc)}", flush=True)
    if not opts.no_fla:
        import numpy as np

        reference_np = (np.asarray(reference[0], np.float32), [np.asarray(r, np.float32) for r in reference[1]])
        done(run_fla(opts.dtype, dims, np.asarray(do.astype(jnp.float32)), reference_np, opts.reps))

    print(f"\nGDN-2, {opts.dtype}, {shape_id}, with an initial state; ms are medians of {opts.reps} synchronised calls")
    print("oracle: worst rel. error of o, state and every gradient vs float64 at B1 T200 H2 d128 (atomic-ops: T256)")
    print("vs_jax_chunk: worst rel. error of o and every gradient vs jax_chunk in fp32 at the timed shape")
    print("compile: lower + compile of the jitted forward / training step (FLA: its first calls, JIT + autotune)\n")
    header = ("impl", "fwd ms", "fwd+bwd ms", "compile s (fwd / fwd+bwd)", "oracle", "vs_jax_chunk", "note")
    keys = ("impl", "fwd", "train", "compile", "oracle", "vs_jax_chunk", "note")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(str(row[k]) for k in keys) + " |")
    if stages:
        names = ("prepare", "walk", "dstate walk", "gradients", "forward", "backward")
        print(
            "\npallas_gpu_chunk by kernel (ms; walk = forward - prepare: the walk and the output kernel; "
            "gradients = backward - dstate walk)\n"
        )
        print("| tiling | " + " | ".join(names) + " |")
        print("|" + "---|" * (len(names) + 1))
        for label, times in stages.items():
            print(f"| {label} | " + " | ".join(f"{times[n]:.3f}" for n in names) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
