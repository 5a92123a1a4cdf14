"""Where the time of deltabench's Pallas GDN-2 GPU kernels goes: each per-chunk kernel timed whole, then with one
part of its work taken out (a diagnostic: the parts taken out make the results wrong, so nothing here is gated).

    python benchmarks/gpu/gdn2_pallas_parts.py [--shape B=8,T=4096,H=6,K=128,V=128] [--warps 4] [--reps 20]
        [--grads-warps 8] [--dots bf16] [--only prepare,gradients,walks]
        [--walk-tilings block_v=128,64,32:num_warps=4,8[:num_stages=1:dots=bf16x3,bf16]]

Rows (bf16 inputs, ``--dots`` products, bf16 by default as ``pallas_gpu_chunk``'s; all of V a program):

* ``prepare``: whole; without the pairwise scores (``A = P = 0``); without the WY solve (``T = I``);
* ``gradients`` (the backward less the cotangent's walk, as ``gdn2_pallas.py --stages``): whole; without the
  scores' gradients; with only their far pairs (products); with only their near pairs (the two 16-step loops);
* ``walks``: the forward's walk (the forward less its prepare: the walk and the output kernel) and the
  cotangent's walk, in every tiling of ``--walk-tilings`` (value columns a program, warps, pipelining depth;
  the walks compile in seconds).

A part that costs little when taken out was not where the time went. Each row compiles its kernels afresh
(``jax.clear_caches``), so a row costs its compile (tens of seconds) beside its timing.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import sys
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
sys.path.insert(0, os.path.dirname(__file__))

from gdn2_pallas import ARGS, make_inputs, parse_shape, timed


@contextlib.contextmanager
def patched(module, **replacements):
    """`module`'s attributes replaced for the block (the kernels look their helpers up when traced), JAX's caches
    cleared on the way in and out so that no compiled kernel of the other form is replayed."""
    import jax

    saved = {name: getattr(module, name) for name in replacements}
    jax.clear_caches()
    for name, value in replacements.items():
        setattr(module, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(module, name, value)
        jax.clear_caches()


def variants():
    """``{kernel: {row: replacements of gpu's helpers}}``."""
    import jax.numpy as jnp

    from deltabench.kernels.gdn2.jax.pallas import gpu

    def no_scores(refs, *_args):
        C = refs[0].shape[0]
        zero = jnp.zeros((C, C), jnp.float32)
        return zero, zero

    forward = gpu.fw

    def identity_solve(A, *_args, **_kw):
        C = A.shape[0]
        return (forward._iota((C, C), 0) == forward._iota((C, C), 1)).astype(jnp.float32)

    class _NoSolve:
        """forward's namespace with the WY solve replaced (the kernels reach it as ``fw._unit_lower_inverse``)."""

        def __getattr__(self, name):
            return identity_solve if name == "_unit_lower_inverse" else getattr(forward, name)

    def far_only(G, q, k, bk, dA, dP, refs, products, init):
        return gpu._far_pairs_backward(G, q, k, bk, dA, dP, refs[0], products, init)

    def near_only(G, q, k, bk, dA, dP, refs, products, init):
        return gpu._near_pairs_backward(G, q, k, bk, dA, dP, refs, init)

    def no_grads(G, q, k, bk, dA, dP, refs, products, init):
        return init

    return {
        "prepare": {
            "whole": {},
            "no pairwise scores": {"_pairwise_scores": no_scores},
            "no WY solve": {"fw": _NoSolve()},
        },
        "gradients": {
            "whole": {},
            "no scores gradients": {"_scores_backward": no_grads},
            "far pairs only": {"_scores_backward": far_only},
            "near pairs only": {"_scores_backward": near_only},
        },
    }


def time_kernel(kernel: str, args, h0, do, options: dict, reps: int, grads: dict) -> tuple[float, float]:
    """(ms, compile s) of the prepare alone, or of the gradient kernels (backward less the cotangent's walk; `grads`:
    the backward's own options)."""
    import jax
    import jax.numpy as jnp

    from deltabench.kernels.gdn2.jax.pallas import gpu

    t0 = time.perf_counter()
    if kernel == "prepare":
        fn = functools.partial(gpu.gdn2_gpu_prepare, *args, **options)
        jax.block_until_ready(fn())
        compile_s = time.perf_counter() - t0
        return timed(fn, reps), compile_s
    scale = args[0].shape[-1] ** -0.5
    h0_t = jnp.swapaxes(h0.astype(jnp.float32), -1, -2)
    _, _, states_t, prepared = gpu.gdn2_gpu_forward(*args, h0_t, scale=scale, store_states=True, **options)
    backward = functools.partial(gpu.gdn2_gpu_backward, *args, do, states_t, jnp.zeros_like(h0_t), prepared)
    jax.block_until_ready(backward(scale=scale, **options, **grads))
    compile_s = time.perf_counter() - t0
    whole = timed(lambda: backward(scale=scale, **options, **grads), reps)
    walk = timed(lambda: backward(scale=scale, dstate_only=True, **options), reps)
    return whole - walk, compile_s


def walk_tilings(text: str) -> list[dict[str, int | str]]:
    """``"block_v=128,64:num_warps=4,8:dots=bf16x3,bf16"`` -> every combination, as tiling dicts (``dots`` takes
    names, every other option integers)."""
    import itertools

    from deltabench.kernels.gdn2.jax.pallas.gpu import DOTS

    axes = []
    for part in text.split(":"):
        name, _, values = part.partition("=")
        if name == "dots":
            if not values or any(v not in DOTS for v in values.split(",")):
                raise ValueError(f"dots must be among {DOTS}")
            axes.append([(name, v) for v in values.split(",")])
        else:
            axes.append([(name, int(v)) for v in values.split(",")])
    return [dict(combo) for combo in itertools.product(*axes)]


def time_walks(args, h0, do, options: dict, reps: int) -> tuple[float, float]:
    """(forward walk ms, cotangent walk ms) in the tiling `options`: the forward less its prepare, and the backward
    stopped after the cotangent's walk."""
    import jax.numpy as jnp

    from deltabench.kernels.gdn2.jax.pallas import gpu

    scale = args[0].shape[-1] ** -0.5
    h0_t = jnp.swapaxes(h0.astype(jnp.float32), -1, -2)
    prepare_options = {k: v for k, v in options.items() if k != "block_v"}
    forward = functools.partial(gpu.gdn2_gpu_forward, *args, h0_t, scale=scale, store_states=True, **options)
    _, _, states_t, prepared = forward()
    prepare = timed(lambda: gpu.gdn2_gpu_prepare(*args, **prepare_options), reps)
    walk = timed(forward, reps) - prepare
    dstate = functools.partial(gpu.gdn2_gpu_backward, *args, do, states_t, jnp.zeros_like(h0_t), prepared)
    return walk, timed(lambda: dstate(scale=scale, dstate_only=True, **options), reps)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="B=8,T=4096,H=6,K=128,V=128")
    parser.add_argument("--warps", default="4", help="Triton warps a program (comma list)")
    parser.add_argument("--grads-warps", type=int, default=None, help="the gradient kernel's own warps")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--only", default="prepare,gradients", help="kernels to take apart (comma list), or walks")
    parser.add_argument(
        "--walk-tilings",
        default="block_v=128,64,32:num_warps=4,8",  # num_stages 3 fits no tiling's shared memory on an H200
        help="walks: the tilings to time, each option's values (every combination)",
    )
    parser.add_argument("--dots", default="bf16", choices=("bf16x3", "bf16"), help="the kernels' products")
    parser.add_argument("--allow-cpu", action="store_true", help="Pallas' interpreter on the CPU (plumbing only)")
    opts = parser.parse_args(argv)
    try:
        walks = walk_tilings(opts.walk_tilings)
    except ValueError:
        parser.error(f"--walk-tilings: expected name=1,2:dots=bf16 (integers; dots by name), got {opts.walk_tilings!r}")

    import jax
    import jax.numpy as jnp

    from deltabench.kernels.gdn2.jax.pallas import gpu

    backend = jax.default_backend()
    print(f"jax {jax.__version__}, backend {backend}, devices {[d.device_kind for d in jax.devices()]}", flush=True)
    if backend != "gpu" and not opts.allow_cpu:
        print("gdn2_pallas_parts: no GPU visible to JAX (--allow-cpu runs the plumbing in the interpreter)")
        return 2
    dims = parse_shape(opts.shape)
    _, a = make_inputs(dims, jnp.bfloat16)
    args = tuple(a[n] for n in ARGS)
    do = jax.random.normal(jax.random.PRNGKey(0), (dims["B"], dims["T"], dims["H"], dims["V"])).astype(jnp.bfloat16)
    kernels = [k for k in opts.only.split(",") if k]
    base = {"chunk": 64, "dots": opts.dots, "interpret": backend != "gpu"}
    if "walks" in kernels:
        print("| walk tiling | forward walk ms | cotangent walk ms |\n|---|---|---|", flush=True)
        for tiling in walks:
            label = ", ".join(f"{k}={v}" for k, v in tiling.items())
            try:
                walk, dstate = time_walks(args, a["initial_state"], do, {**base, **tiling}, opts.reps)
                print(f"| {label} | {walk:.3f} | {dstate:.3f} |", flush=True)
            except Exception as exc:  # a tiling that does not compile says so and the rest still run
                print(f"| {label} | failed: {str(exc).splitlines()[0][:120]} | |", flush=True)
        kernels.remove("walks")
    if kernels:
        print("| kernel | warps | row | ms | compile s |\n|---|---|---|---|---|", flush=True)
    for warps in (int(w) for w in opts.warps.split(",")):
        options = {**base, "num_warps": warps}
        grads = {"grads_warps": opts.grads_warps} if opts.grads_warps else {}
        for kernel in kernels:
            for row, replacements in variants()[kernel].items():
                try:
                    with patched(gpu, **replacements):
                        ms, compile_s = time_kernel(kernel, args, a["initial_state"], do, options, opts.reps, grads)
                    print(f"| {kernel} | {warps} | {row} | {ms:.3f} | {compile_s:.1f} |", flush=True)
                except Exception as exc:  # a row that does not compile says so and the rest still run
                    print(f"| {kernel} | {warps} | {row} | failed: {str(exc).splitlines()[0][:120]} | |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
