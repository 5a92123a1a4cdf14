"""GDN's Triton kernels (imported only through their impl targets: importing this package needs no Triton).

- :mod:`.chunk`: ``triton_chunk``, the chunked forward (:mod:`.wy`, then :mod:`.state`'s walk with the outputs) and
  backward (:mod:`.state`'s reverse walk, then :mod:`.local_bwd`);
- :mod:`.chunk_split`: ``triton_chunk_split``, the same backward with a split forward (:mod:`.wy`, the state walk of
  :mod:`.walk`, the parallel output of :mod:`.output`);
- :mod:`.auto`: ``triton_chunk_auto``, one of the two forwards (and the walks' segments) picked by shape;
- :mod:`.fused_recurrent`: ``triton_recurrent``, token-serial, forward only.
"""
