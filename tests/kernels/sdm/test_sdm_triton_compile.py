"""The Triton kernels of the SDM backward (and the forward steps that feed it) compile for an H100/H200 (sm_90) on
this CPU machine.

The other SDM tests run the kernels under TRITON_INTERPRET=1, which executes them as NumPy and cannot see what only
the GPU compiler rejects (a dot of a wrong shape or dtype, a type clash in a loop-carried value, too much shared
memory). Here each kernel goes through Triton's real pipeline down to a cubin (ptxas ships with triton), in a fresh
process without the interpreter, at a small configuration (C = 8, W = 3, R = 2, D = 64).
"""

from __future__ import annotations

import os
import subprocess
import sys

_COMPILE_ALL = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from deltabench.kernels.sdm.triton import triton_chunk as F, triton_chunk_bwd as B
from deltabench.kernels.sdm.triton import phase1_sorted as FS, phase1_sorted_bwd as BS

C, W, R = 8, 3, 2
E, P, BC = C * W, C * R, 16
I64, I32 = {"slot_w", "slot_r"}, {"first", "rep", "order", "pos", "start", "end"}
KERNELS = {
    F.gram_kernel: dict(C=C, E=E, P=P, W=W, R=R, BLOCK_W=16, BLOCK_R=16, BLOCK_COL=32, BLOCK_C=BC),
    F.gather_kernel: dict(S=40, D=64, E=E, P=P, W=W, R=R, BLOCK_W=4, BLOCK_R=2, BLOCK_D=64, SAVE=True),
    F.update_kernel: dict(S=40, D=64, C=C, E=E, ENTRIES=32, BLOCK_E=32, BLOCK_C=BC, BLOCK_D=32, SAVE=True, PREC=0),
    B.gather_weights_kernel: dict(C=C, E=E, P=P, W=W, R=R, BLOCK_ROW=32, BLOCK_COL=32, BLOCK_C=BC),
    B.bwd_entries_kernel: dict(S=40, D=64, C=C, E=E, W=W, ENTRIES=32, BLOCK_E=32, BLOCK_C=BC, BLOCK_D=32, PREC=0),
    B.bwd_tokens_kernel: dict(D=64, C=C, BLOCK_C=BC, BLOCK_D=32, PREC=0),
    B.bwd_rewrite_kernel: dict(
        S=40, D=64, C=C, E=E, P=P, W=W, R=R, ENTRIES=64, BLOCK_E=32, BLOCK_C=BC, BLOCK_D=32, PREC=0
    ),
    B.solve_bwd_kernel: dict(C=C, BLOCK_C=BC),
    B.gram_bwd_kernel: dict(C=C, E=E, P=P, W=W, R=R, BLOCK_ROW=32, BLOCK_COL=32),
    B.decay_bwd_kernel: dict(E=E, P=P, W=W, R=R, BLOCK_ROW=32, BLOCK_COL=32),
    FS.run_decay_kernel: dict(E=E, P=P, BLOCK=32),
    FS.run_gram_kernel: dict(C=C, E=E, P=P, W=W, R=R, BLOCK_W=4, BLOCK_R=2, BLOCK_C=BC, AQK=True),
    BS.run_gather_weights_kernel: dict(C=C, E=E, P=P, W=W, R=R, BLOCK=32, BLOCK_C=BC),
    BS.run_gram_bwd_kernel: dict(C=C, E=E, P=P, W=W, R=R, BLOCK=32),
    BS.run_decay_bwd_kernel: dict(E=E, P=P, W=W, R=R, BLOCK=32),
}
# the kernels with a dot precision (triton_chunk_bwd.DOT_PRECISION) compile at each one
CASES = []
for fn, const in KERNELS.items():
    precisions = ("ieee", "tf32x3") if "PREC" in const else (None,)
    CASES += [(fn, const if p is None else {**const, "PREC": p}) for p in precisions]
for fn, const in CASES:
    sig = {}
    for a in fn.arg_names:
        if a in const:
            sig[a] = "constexpr"
        elif a in ("chunk", "N", "rows_n", "rows_c0", "out_n", "out_c0", "seg_n", "seg_c0", "groups"):
            sig[a] = "i32"
        else:
            sig[a] = "*i64" if a in I64 else "*i32" if a in I32 else "*fp32"
    options = dict(F.LAUNCH)
    triton.compile(ASTSource(fn, sig, const), target=GPUTarget("cuda", 90, 32), options=options)
    print("compiled", fn.__name__, const.get("PREC", ""), flush=True)
"""


def test_every_sdm_kernel_compiles_for_sm90() -> None:
    """The forward's Gram, gather and update kernels (which the backward's replay runs again), the backward's
    seven kernels and the five of Phase 1 and its backward by slot runs (PHASE1 = "sort") compile to sm_90 code
    without a GPU, the four with a dot precision at both of theirs."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-c", _COMPILE_ALL], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("compiled ") == 19 and done.stdout.count(" tf32x3") == 4, done.stdout
