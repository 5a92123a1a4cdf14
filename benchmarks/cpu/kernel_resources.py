"""Registers and spills of deltabench's Triton GDN kernels for a Hopper GPU, computed on a machine without one.

Spills are what the H200 sweeps blamed for the gap to FLA at large shapes (benchmarks/NOTES.md: wy_fwd, state_bwd
and local_bwd at 255 registers with spills). This script gives that figure in seconds, without device time:

1. it runs a Triton impl's Python entry (forward and backward) on CPU tensors of the requested shape with every
   ``@triton.jit`` kernel of kernels/gdn/triton/ replaced by a recorder, so each launch's arguments,
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

    python benchmarks/cpu/kernel_resources.py [--shape B=8,T=4096,H=6,K=128,V=128] [--dtype bf16]
        [--impl triton_chunk] [--arch 90] [--cuobjdump PATH]
"""

from __future__ import annotations

import argparse
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

KERNEL_MODULES = (wy, state, walk, output, local_bwd)
ENTRIES = {"triton_chunk": chunk.gdn_triton_chunk, "triton_chunk_split": chunk_split.gdn_triton_chunk_split}
POINTER_TYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.int32: "i32"}
LAUNCH_OPTIONS = ("num_warps", "num_stages")


class _Recorder:
    """Stands in for one ``@triton.jit`` kernel: ``kernel[grid](*args, **kwargs)`` only records the call."""

    def __init__(self, fn: Any, calls: list) -> None:
        self.fn, self.calls = fn, calls

    def __getitem__(self, grid: Any) -> Any:
        return lambda *args, **kwargs: self.calls.append((self.fn, args, kwargs))


def record_launches(entry: Any, shape: dict[str, int], dtype: torch.dtype) -> list:
    """Every kernel launch of `entry`'s forward and backward at `shape`, as (jit function, args, kwargs)."""
    calls: list = []
    swapped = []
    for module in KERNEL_MODULES:
        for name, obj in vars(module).items():
            if isinstance(obj, triton.runtime.jit.JITFunction):
                swapped.append((module, name, obj))
    for module, name, obj in swapped:
        setattr(module, name, _Recorder(obj, calls))
    try:
        B, T, H, K, V = (shape[d] for d in "BTHKV")
        q, k = torch.randn(B, T, H, K, dtype=dtype), torch.randn(B, T, H, K, dtype=dtype)
        v = torch.randn(B, T, H, V, dtype=dtype)
        g, beta = -torch.rand(B, T, H), torch.rand(B, T, H, dtype=dtype)
        leaves = [t.requires_grad_(True) for t in (q, k, v, g, beta)]
        o, ht = entry(*leaves)
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


def main() -> int:
    """Record one impl's launches at a shape, compile each for the target, print a markdown table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="B=8,T=4096,H=6,K=128,V=128")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--impl", default="triton_chunk", choices=sorted(ENTRIES))
    ap.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 90 for Hopper")
    default_tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    ap.add_argument("--cuobjdump", default=default_tool)
    args = ap.parse_args()
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        ap.exit(2, "kernel_resources.py: unset TRITON_INTERPRET (the interpreter's kernels cannot be compiled)\n")
    try:
        shape = parse_shape(args.shape, "gdn")
        dtype = torch_dtype(args.dtype)
    except BadInput as e:
        ap.exit(2, f"kernel_resources.py: {e}\n")
    if not os.path.exists(args.cuobjdump):
        ap.exit(2, f"kernel_resources.py: no cuobjdump at {args.cuobjdump} (pass --cuobjdump)\n")
    calls = record_launches(ENTRIES[args.impl], shape, dtype)
    print(f"{args.impl} at {args.shape} {args.dtype}, sm_{args.arch}, Triton {triton.__version__}")
    print("| kernel | constexprs | warps | stages | registers | stack bytes | compile s |")
    print("|---|---|---|---|---|---|---|")
    seen = set()
    target = GPUTarget("cuda", args.arch, 32)
    backend = make_backend(target)
    for fn, call_args, call_kwargs in calls:
        kwargs = dict(call_kwargs)
        options = {o: kwargs.pop(o) for o in LAUNCH_OPTIONS if o in kwargs}
        signature, constexprs, hints = signature_of(fn, call_args, kwargs)
        key = (fn.__name__, repr(sorted(constexprs.items())), repr(sorted(options.items())))
        if key in seen:
            continue
        seen.add(key)
        t0 = time.perf_counter()
        attrs = {(fn.arg_names.index(n),): backend.parse_attr(h) for n, h in hints.items()}
        compiled = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=target, options=options)
        use = cubin_usage(compiled.asm["cubin"], args.cuobjdump)
        shown = ", ".join(f"{k}={v}" for k, v in constexprs.items() if k not in ("H", "K", "V", "C"))
        print(
            f"| {fn.__name__} | {shown} | {options.get('num_warps', '-')} | {options.get('num_stages', '-')} | "
            f"{use['registers']} | {use['stack']} | {time.perf_counter() - t0:.1f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
