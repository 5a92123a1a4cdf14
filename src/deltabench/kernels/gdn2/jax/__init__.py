"""GDN-2 in JAX (imported only through their impl targets: importing this package needs no JAX).

- :mod:`.jax_chunk`: ``jax_chunk``, the chunked WY/UT form;
- :mod:`.jax_scan`: ``jax_scan``, the associative-scan baseline;
- :mod:`.pallas`: ``pallas_chunk`` of gdn2 and kda, fused Pallas kernels (Mosaic on a TPU, the interpreter on the
  CPU). Pallas is JAX's kernel language and these impls' backend is ``jax``, so they live here.
"""
