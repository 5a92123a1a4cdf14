"""Registers and spills of deltabench's Triton kernels (GDN, GDN-2, KDA) for a Hopper GPU, computed on a machine
without one.

Spills are what the H200 sweeps blamed for the gap to FLA at large shapes (benchmarks/NOTES.md: wy_fwd, state_bwd
and local_bwd at 255 registers with spills). This script gives that figure in seconds, without device time:

1. it runs a Triton impl's Python entry (forward and backward) on CPU tensors of the requested shape with every
   ``@triton.jit`` kernel of its op's kernel modules (kernels/gdn/triton/, kernels/gdn2/triton/) replaced by a
   recorder, so each launch's arguments,
   constexprs, warps and stages are exactly the launcher's choice for that shape (nothing is computed);
2. it compiles each distinct launch for the target (``sm_90a`` by default) with Triton's own compiler (and so
   its ptxas), and reads the cubin's registers per thread and stack frame bytes (where these kernels' spills go)
   with cuobjdump.

The figures depend on the Triton version and its ptxas: compare like with like. The H200 runs Triton 3.6.0, so for
its figures install that version beside the project's (``pip download --no-deps triton==3.6.0`` for this machine's
Python, ``pip install --no-deps --target DIR``) and put DIR first on PYTHONPATH. The GPU's own figures
(``benchmarks/gdn_kernels.py``: the driver's registers, and local memory per thread / 4 as "spills") are the
check on this one.

Usage::

    python benchmarks/cpu/kernel_resources.py [--op gdn] [--shape B=8,T=4096,H=6,K=128,V=128] [--dtype bf16]
        [--seqlens 17,64,1,218] [--impl triton_chunk] [--launch pair_block_k=32 ...] [--arch 90]
        [--cuobjdump PATH]

``--launch KEY=VALUE`` (an integer, True or False) sets one entry of the op's fixed launch tables (GDN-2 / KDA:
``LAUNCH`` and ``BWD_LAUNCH``) for the run, to read a candidate config's registers before a GPU sweep times it.
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import subprocess
import sys
import tempfile
import time
from typing import Any

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend

from deltabench.harness.cases import parse_shape, torch_dtype
from deltabench.harness.errors import BadInput
from deltabench.kernels.gdn.triton import chunk, chunk_split, local_bwd, output, state, walk, wy
from deltabench.kernels.gdn2.triton import chunk as gdn2_chunk
from deltabench.kernels.gdn2.triton import chunk_bwd as gdn2_chunk_bwd

# Per op: its Triton kernel modules, its entries by impl name, the launch tables `--launch` may set
KERNEL_MODULES = {"gdn": (wy, state, walk, output, local_bwd), "gdn2": (gdn2_chunk, gdn2_chunk_bwd)}
KERNEL_MODULES["kda"] = KERNEL_MODULES["gdn2"]
ENTRIES = {
    "gdn": {"triton_chunk": chunk.gdn_triton_chunk, "triton_chunk_split": chunk_split.gdn_triton_chunk_split},
    "gdn2": {"triton_chunk": gdn2_chunk.gdn2_triton_chunk},
    "kda": {"triton_chunk": gdn2_chunk.kda_triton_chunk},
}
LAUNCH_TABLES = {"gdn": (), "gdn2": (gdn2_chunk.LAUNCH, gdn2_chunk_bwd.BWD_LAUNCH)}
LAUNCH_TABLES["kda"] = LAUNCH_TABLES["gdn2"]
POINTER_TYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.int32: "i32"}
LAUNCH_OPTIONS = ("num_warps", "num_stages")
# The most dynamic shared memory one block may take (bytes): a launch over it fails with OutOfResources on the GPU.
SHARED_LIMIT = {90: 232448, 80: 166912, 89: 101376, 100: 232448}


class _Recorder:
    """Stands in for one ``@triton.jit`` kernel: ``kernel[grid](*args, **kwargs)`` only records the call."""

    def __init__(self, fn: Any, calls: list) -> None:
        self.fn, self.calls = fn, calls

    def __getitem__(self, grid: Any) -> Any:
        return lambda *args, **kwargs: self.calls.append((self.fn, args, kwargs))


def _leaves(op: str, shape: dict[str, int], dtype: torch.dtype, rows: int, h0: bool) -> dict[str, torch.Tensor]:
    """The op's inputs at `shape` as leaves wanting gradients (an initial state of `rows` rows with `h0`)."""
    B, T, H, K, V = (shape[d] for d in "BTHKV")
    if op == "gdn":
        x = {"q": torch.randn(B, T, H, K, dtype=dtype), "k": torch.randn(B, T, H, K, dtype=dtype)}
        x |= {"v": torch.randn(B, T, H, V, dtype=dtype), "g": -torch.rand(B, T, H)}
        x["beta"] = torch.rand(B, T, H, dtype=dtype)
    else:
        from deltabench.references import gdn2, kda

        x = (gdn2 if op == "gdn2" else kda).make_inputs(B, T, H, K, V, dtype=dtype)
        x.pop("initial_state", None)
    if h0:
        x["initial_state"] = torch.randn(rows, H, K, V)
    return {n: t.requires_grad_(True) for n, t in x.items()}


def record_launches(
    entry: Any,
    shape: dict[str, int],
    dtype: torch.dtype,
    seqlens: list[int] | None = None,
    h0: bool = False,
    op: str = "gdn",
) -> list:
    """Every kernel launch of `entry`'s forward and backward at `shape` (packed as `seqlens`, whose sum is T, when
    given: the kernels' packed variants; from an initial state with `h0`), as (jit function, args, kwargs)."""
    calls: list = []
    swapped = []
    for module in KERNEL_MODULES[op]:
        for name, obj in vars(module).items():
            if isinstance(obj, triton.runtime.jit.JITFunction):
                swapped.append((module, name, obj))
    for module, name, obj in swapped:
        setattr(module, name, _Recorder(obj, calls))
    try:
        cu = None if seqlens is None else torch.tensor([0, *itertools.accumulate(seqlens)], dtype=torch.int32)
        extra: dict[str, Any] = {} if cu is None else {"cu_seqlens": cu}
        o, ht = entry(**_leaves(op, shape, dtype, shape["B"] if seqlens is None else len(seqlens), h0), **extra)
        (o.float().sum() + ht.sum()).backward()
    finally:
        # the compiler hashes each kernel with the helpers it calls: the real functions must be back first
        for module, name, obj in swapped:
            setattr(module, name, obj)
    return calls


def signature_of(fn: Any, args: tuple, kwargs: dict) -> tuple[dict[str, str], dict[str, Any], dict[str, str]]:
    """Triton's (signature, constexprs, specialisations) for one recorded launch, specialised as its launcher
    does on a GPU: pointers 16-byte aligned (CUDA allocations are), integers that are multiples of 16 marked so,
    an integer equal to 1 folded in as a constant. Without these hints the compiler cannot vectorise loads, and
    the figures would be far from the GPU's."""
    signature: dict[str, str] = {}
    constexprs: dict[str, Any] = {}
    hints: dict[str, str] = {}
    for i, name in enumerate(fn.arg_names):
        if name in kwargs:
            signature[name], constexprs[name] = "constexpr", kwargs[name]
            continue
        value = args[i] if i < len(args) else None
        if isinstance(value, torch.Tensor):
            signature[name], hints[name] = "*" + POINTER_TYPES[value.dtype], "D"
        elif isinstance(value, bool):
            signature[name] = "i1"
        elif isinstance(value, int) and value == 1:
            signature[name], constexprs[name] = "constexpr", 1
        elif isinstance(value, int):
            signature[name] = "i32" if -(2**31) <= value < 2**31 else "i64"
            if value % 16 == 0:
                hints[name] = "D"
        elif isinstance(value, float):
            signature[name] = "fp32"
        else:
            signature[name], constexprs[name] = "constexpr", value
    return signature, constexprs, hints


def cubin_usage(cubin: bytes, cuobjdump: str) -> dict[str, int]:
    """Registers per thread and stack frame bytes (spills, for these kernels) of a compiled kernel, as
    ``cuobjdump --dump-resource-usage`` reads them from the cubin that Triton's own ptxas produced."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        run = subprocess.run([cuobjdump, "--dump-resource-usage", path], capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"cuobjdump failed: {(run.stderr or run.stdout).strip()[-500:]}")
    figures = {"registers": r"REG:(\d+)", "stack": r"STACK:(\d+)"}
    return {key: int(m.group(1)) if (m := re.search(rx, run.stdout)) else -1 for key, rx in figures.items()}


def compile_launches(
    impl: str,
    shape: dict[str, int],
    dtype: torch.dtype,
    seqlens: list[int] | None = None,
    h0: bool = False,
    arch: int = 90,
    cuobjdump: str | None = None,
    done: dict | None = None,
    op: str = "gdn",
) -> list[dict[str, Any]]:
    """Each distinct launch of `impl` at `shape` (see :func:`record_launches`) compiled for sm_`arch`: its kernel,
    constexprs, warps, stages, shared memory bytes, compile seconds, and with `cuobjdump` its registers and stack
    bytes (-1 without). `done`: launches already compiled by earlier calls (filled in), not compiled again."""
    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    found, seen = [], set()
    done = {} if done is None else done
    for fn, call_args, call_kwargs in record_launches(ENTRIES[op][impl], shape, dtype, seqlens, h0, op):
        kwargs = dict(call_kwargs)
        options = {o: kwargs.pop(o) for o in LAUNCH_OPTIONS if o in kwargs}
        signature, constexprs, hints = signature_of(fn, call_args, kwargs)
        key = (fn.__module__, fn.__name__, repr(sorted(constexprs.items())), repr(sorted(options.items())))
        if key in seen:
            continue
        seen.add(key)
        if key in done:
            found.append(done[key])
            continue
        t0 = time.perf_counter()
        attrs = {(fn.arg_names.index(n),): backend.parse_attr(h) for n, h in hints.items()}
        compiled = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=target, options=options)
        use = cubin_usage(compiled.asm["cubin"], cuobjdump) if cuobjdump else {"registers": -1, "stack": -1}
        done[key] = {
            "kernel": fn.__name__,
            "constexprs": ", ".join(f"{k}={v}" for k, v in constexprs.items() if k not in ("H", "K", "V", "C")),
            "warps": options.get("num_warps", "-"),
            "stages": options.get("num_stages", "-"),
            "shared": compiled.metadata.shared,
            "compile_s": time.perf_counter() - t0,
            **use,
        }
        found.append(done[key])
    return found


def main() -> int:
    """Record one impl's launches at a shape, compile each for the target, print a markdown table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--op", default="gdn", choices=sorted(ENTRIES))
    ap.add_argument("--shape", default="B=8,T=4096,H=6,K=128,V=128")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--seqlens", help="pack sequences of these lengths (sum = T), e.g. 17,64,1,218")
    ap.add_argument("--initial-state", action="store_true", help="from an initial state (the HAS_H0 variants)")
    ap.add_argument("--impl", default="triton_chunk")
    ap.add_argument("--launch", nargs="*", default=[], metavar="KEY=VALUE", help="set a launch table entry")
    ap.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 90 for Hopper")
    default_tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    ap.add_argument("--cuobjdump", default=default_tool)
    args = ap.parse_args()
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        ap.exit(2, "kernel_resources.py: unset TRITON_INTERPRET (the interpreter's kernels cannot be compiled)\n")
    if args.impl not in ENTRIES[args.op]:
        ap.exit(
            2, f"kernel_resources.py: {args.op} has no Triton impl {args.impl!r} here: {sorted(ENTRIES[args.op])}\n"
        )
    try:
        shape = parse_shape(args.shape, args.op)
        dtype = torch_dtype(args.dtype)
    except BadInput as e:
        ap.exit(2, f"kernel_resources.py: {e}\n")
    for item in args.launch:
        key, _, value = item.partition("=")
        table = next((t for t in LAUNCH_TABLES[args.op] if key in t), None)
        flag = {"True": True, "False": False}.get(value)
        if table is None or not (value.isdigit() or flag is not None):
            msg = f"--launch {item!r}: not KEY=INT|True|False for a key of {args.op}'s launch tables"
            ap.exit(2, f"kernel_resources.py: {msg}\n")
        table[key] = int(value) if flag is None else flag
    if not os.path.exists(args.cuobjdump):
        ap.exit(2, f"kernel_resources.py: no cuobjdump at {args.cuobjdump} (pass --cuobjdump)\n")
    seqlens = [int(n) for n in args.seqlens.split(",")] if args.seqlens else None
    if seqlens is not None and (sum(seqlens) != shape["T"] or shape["B"] != 1 or min(seqlens) < 1):
        ap.exit(2, f"kernel_resources.py: --seqlens must be >= 1 each and sum to T = {shape['T']}, with B = 1\n")
    packed = f", packed as {len(seqlens)} sequences" if seqlens else ""
    launch = f", launch {' '.join(args.launch)}" if args.launch else ""
    where = f"sm_{args.arch}, Triton {triton.__version__}"
    print(f"{args.op} {args.impl} at {args.shape}{packed} {args.dtype}{launch}, {where}")
    print(f"shared memory limit of sm_{args.arch}: {SHARED_LIMIT.get(args.arch, 'unknown')} bytes a block")
    print("| kernel | constexprs | warps | stages | registers | stack bytes | shared bytes | compile s |")
    print("|---|---|---|---|---|---|---|---|")
    found = compile_launches(
        args.impl, shape, dtype, seqlens, args.initial_state, args.arch, args.cuobjdump, op=args.op
    )
    for use in found:
        print(
            f"| {use['kernel']} | {use['constexprs']} | {use['warps']} | {use['stages']} | {use['registers']} | "
            f"{use['stack']} | {use['shared']} | {use['compile_s']:.1f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
