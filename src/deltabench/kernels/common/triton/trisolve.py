"""The chunk's UT-transform inverse ``(I + A)^{-1}`` in Triton, shared by GDN's and GDN-2's (and KDA's) kernels.

A chunk of C = 64 tokens is held as four row blocks of 16 (Triton cannot slice register tiles, so the kernels
load and keep the blocks separately): ``A`` is given as its ten lower blocks ``A_ab`` (a >= b; the diagonal ones
strictly lower), and so is the inverse ``L``: the four diagonal blocks by forward substitution, the off-diagonal
ones by ``L_ab = -L_aa sum_{c=b}^{a-1} A_ac L_cb``. The rows of ``L`` are stored per token (``[.., C]`` a row) with
the blocks above the diagonal left unwritten: readers mask them.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .mma import mma

__all__ = ["block_unit_lower_inverse", "store_row_blocks", "unit_lower_inverse"]


@triton.jit
def unit_lower_inverse(A, BC: tl.constexpr):
    """(I + A)^{-1} for a strictly lower-triangular fp32 block A [BC, BC], by forward substitution.

    A loop, not unrolled: unrolled (tl.static_range), GDN's inverse kernel spilled at K = 128 bf16 (144 stack
    bytes with 2 warps, 112 with 4, 80 with 8; Triton 3.6, sm_90a), as a loop it does not."""
    r = tl.arange(0, BC)
    inv = (r[:, None] == r[None, :]).to(tl.float32)
    for i in range(1, BC):
        a_i = tl.sum(tl.where(r[:, None] == i, A, 0.0), axis=0)  # row i of A, indexed by column
        s = tl.sum(a_i[:, None] * inv, axis=0)  # sum_j a_ij inv_j (rows j >= i of inv meet a_ij = 0)
        inv = tl.where(r[:, None] == i, inv - s[None, :], inv)
    return inv


@triton.jit
def block_unit_lower_inverse(A00, A11, A22, A33, A10, A20, A21, A30, A31, A32, BC: tl.constexpr, MP: tl.constexpr):
    """The ten lower blocks of ``(I + A)^{-1}`` from A's, returned as ``(L00, L10, L11, L20, L21, L22, L30, L31,
    L32, L33)``. MP: the precision of the off-diagonal merges' fp32 products ("ieee", or "tf32")."""
    L00 = unit_lower_inverse(A00, BC)
    L11 = unit_lower_inverse(A11, BC)
    L22 = unit_lower_inverse(A22, BC)
    L33 = unit_lower_inverse(A33, BC)
    L10 = -mma(L11, mma(A10, L00, MP), MP)
    L21 = -mma(L22, mma(A21, L11, MP), MP)
    L20 = -mma(L22, mma(A20, L00, MP) + mma(A21, L10, MP), MP)
    L32 = -mma(L33, mma(A32, L22, MP), MP)
    L31 = -mma(L33, mma(A31, L11, MP) + mma(A32, L21, MP), MP)
    L30 = -mma(L33, mma(A30, L00, MP) + mma(A31, L10, MP) + mma(A32, L20, MP), MP)
    return L00, L10, L11, L20, L21, L22, L30, L31, L32, L33


@triton.jit
def store_row_blocks(L, l0, l1, l2, l3, row, mt, sub: tl.constexpr, BC: tl.constexpr, C: tl.constexpr):
    """Row block `sub` of a chunk's lower-triangular [C, C] matrix, one row of C per token at `row`: its blocks
    (sub, b) for b <= sub (the blocks above are left unwritten; pass any block in their places)."""
    rc = tl.arange(0, BC)
    tl.store(L + row[:, None] * C + rc[None, :], l0, mask=mt[:, None])
    if sub >= 1:
        tl.store(L + row[:, None] * C + BC + rc[None, :], l1, mask=mt[:, None])
    if sub >= 2:
        tl.store(L + row[:, None] * C + 2 * BC + rc[None, :], l2, mask=mt[:, None])
    if sub >= 3:
        tl.store(L + row[:, None] * C + 3 * BC + rc[None, :], l3, mask=mt[:, None])
