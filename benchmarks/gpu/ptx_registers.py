"""Registers and spills of the GPU kernels XLA compiled: ``ptxas -v`` over the PTX an XLA dump holds.

Pallas' Triton kernels reach the GPU inside XLA's modules, so Triton's own metadata (``n_regs``, ``n_spills``) is
not at hand; XLA writes each module's PTX when run with ``XLA_FLAGS=--xla_dump_to=DIR``, and ``ptxas -v`` says,
function by function, how many registers it used and how many bytes it spilled. Usage::

    XLA_FLAGS="--xla_dump_to=/tmp/dump --xla_dump_hlo_module_re=.*gdn2_gpu.*" python3 benchmarks/gpu/gdn2_pallas.py ...
    python3 benchmarks/gpu/ptx_registers.py /tmp/dump --match gdn2

Exit 2 with one line when the folder holds no PTX or no ptxas is found.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys

_FUNCTION = re.compile(r"Compiling entry function '([^']+)' for '([^']+)'")
_SPILLS = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
_REGISTERS = re.compile(r"Used (\d+) registers")


def find_ptxas() -> str | None:
    """A ptxas to run: $PTXAS, then the PATH, then the CUDA compilers that JAX's and Triton's wheels carry."""
    candidates = [os.environ.get("PTXAS", ""), shutil.which("ptxas") or ""]
    for module in ("nvidia.cuda_nvcc", "triton"):
        try:
            base = os.path.dirname(__import__(module, fromlist=["_"]).__file__ or "")
        except ImportError:
            continue
        candidates += glob.glob(os.path.join(base, "**", "bin", "ptxas"), recursive=True)
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


def parse(report: str) -> list[dict[str, object]]:
    """``ptxas -v``'s lines -> one row per entry function: name, registers, spill stores and loads (bytes)."""
    rows: list[dict[str, object]] = []
    for line in report.splitlines():
        if m := _FUNCTION.search(line):
            rows.append({"function": m.group(1), "registers": None, "spill_stores": 0, "spill_loads": 0})
        elif rows and (m := _SPILLS.search(line)):
            rows[-1]["spill_stores"], rows[-1]["spill_loads"] = int(m.group(1)), int(m.group(2))
        elif rows and (m := _REGISTERS.search(line)):
            rows[-1]["registers"] = int(m.group(1))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dump", help="the folder given to --xla_dump_to")
    parser.add_argument("--match", default="", help="only the functions whose names contain this")
    parser.add_argument("--arch", default="sm_90a")
    opts = parser.parse_args(argv)
    ptx_files = sorted(glob.glob(os.path.join(opts.dump, "**", "*.ptx"), recursive=True))
    if not ptx_files:
        print(f"ptx_registers: no .ptx file under {opts.dump}", file=sys.stderr)
        return 2
    ptxas = find_ptxas()
    if ptxas is None:
        print("ptx_registers: no ptxas found (set PTXAS)", file=sys.stderr)
        return 2
    print(f"ptxas: {ptxas}")
    print("| module | function | registers | spill stores (B) | spill loads (B) |")
    print("|---|---|---|---|---|")
    for path in ptx_files:
        run = subprocess.run(
            [ptxas, "-v", f"-arch={opts.arch}", path, "-o", os.devnull], capture_output=True, text=True, check=False
        )
        if run.returncode:
            print(f"| {os.path.basename(path)} | ptxas failed: {run.stderr.strip().splitlines()[-1:]} | | | |")
            continue
        for row in parse(run.stderr + run.stdout):
            if opts.match in str(row["function"]):
                module = os.path.basename(path).split(".sm_")[0]  # module_NNNN.<jit name>: in compile order
                print(
                    f"| {module} | {row['function']} | {row['registers']} | {row['spill_stores']} "
                    f"| {row['spill_loads']} |"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
