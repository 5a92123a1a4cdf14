"""GDN in JAX (imported only through their impl targets: importing this package needs no JAX).

- :mod:`.jax_chunk`: ``jax_chunk``, the chunked WY/UT form;
- :mod:`.jax_scan`: ``jax_scan``, the associative-scan baseline.
"""
