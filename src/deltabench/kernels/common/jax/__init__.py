"""Helpers shared by the ops' JAX kernels (imported by the kernels only: importing this package needs no JAX).

- :mod:`.jax_bridge`: the torch-facing wrapper of a JAX kernel (``TorchFacingJaxOp``), device placement, conversions;
- :mod:`.jax_compile`: XLA compilation settings (persistent cache, the fast CPU compiler);
- :mod:`.jax_wy`: the chunk layout and the WY/UT transform of the chunked JAX kernels;
- :mod:`.jax_trisolve`: the unit-lower-triangular solve each backend uses;
- :mod:`.jax_affine`: the associative scan of per-token affine maps (the ``jax_scan`` baselines).
"""
