"""Helpers shared by the ops' Triton kernels (imported by the kernels only: importing this package needs no Triton).

- :mod:`.mma`: the one tile product every kernel uses (16-bit operands widened under the CPU interpreter), its
  precision for an input dtype and the tile width for a head dimension.
- :mod:`.trisolve`: the chunk's UT-transform inverse ``(I + A)^{-1}`` by 16-row blocks, and storing its rows.
"""
