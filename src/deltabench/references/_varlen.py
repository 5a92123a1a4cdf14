"""The float64 oracle of packed sequences: the op's oracle run on each sequence alone, one after another.

Packed sequences follow FLA's convention (contract.CU_SEQLENS): a batch of one row, the sequences concatenated
along T at the int32 offsets ``cu_seqlens`` [N + 1], and the initial and final states one row per sequence
[N, ...]. Nothing here knows how a kernel packs them: each sequence is cut out, run from its own initial state and
its outputs put back where it lay, so that nothing can cross a boundary.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import torch

from .contract import OpContract

__all__ = ["by_sequence"]


def by_sequence(contract: OpContract) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """`contract`'s oracle over packed sequences: ``fn(*inputs, cu_seqlens, <state>=None, **kw) -> (o, states)``,
    the output [1, T, ...] and the final states [N, ...], each sequence run alone from its own state row."""

    def packed(*args: torch.Tensor, cu_seqlens: torch.Tensor, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        offsets = [int(x) for x in cu_seqlens.tolist()]
        h0 = kwargs.pop(contract.state_arg, None)
        outs, states = [], []
        for i, (bos, eos) in enumerate(itertools.pairwise(offsets)):
            seq = [x[:, bos:eos] if a.sequence else x for a, x in zip(contract.inputs, args, strict=True)]
            state = None if h0 is None else h0[i : i + 1]
            o, final = contract.oracle(*seq, **{contract.state_arg: state}, **kwargs)
            outs.append(o)
            states.append(final)
        return torch.cat(outs, dim=1), torch.cat(states)

    return packed
