"""GDN-2's (and KDA's) Triton kernels (imported only through their impl targets: importing this package needs no
Triton).

- :mod:`.chunk`: ``triton_chunk``, the chunked forward (chunk C = 64) for ops ``gdn2`` and ``kda``, and its autograd
  entry;
- :mod:`.chunk_bwd`: the backward's kernels (reverse state walk, local and pairwise-score gradients);
- :mod:`.layout`: what both share (chunk and row-block sizes, the launch table, the row helpers).
"""
