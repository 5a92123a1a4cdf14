"""An ``--import`` file for deltabench's gate: SDM's Triton forward and backward with Phase 1 and its backward's pair
work by slot runs (``triton_chunk.PHASE1 = "sort"``), set in the gate's child processes too.

Usage::

    TRITON_INTERPRET=1 deltabench verify --op sdm --impl triton_chunk --device cpu \\
        --shape B=1,T=20,H=1,S=16,D=4,W=3,R=3 --dtype fp32 --seeds 1 --mode fwd+bwd --deterministic \\
        --regime typical --timeout 2400 --import benchmarks/cpu/sdm_phase1_sort.py
"""

from __future__ import annotations

from deltabench.kernels.sdm.triton import triton_chunk

triton_chunk.PHASE1 = "sort"
