"""The unit-lower-triangular solve of the JAX chunked kernels: ``(I + A) X = R``, ``A`` strictly lower.

Two ways to solve, one contract:

* on GPUs and TPUs, the backend's own ``triangular_solve`` (cuBLAS trsm; XLA's blocked solve on TPUs);
* on the CPU, forward substitution written in JAX, one row of ``C`` at a time. The CPU's ``triangular_solve``
  calls jaxlib's LAPACK trsm kernel, which splits its batch over XLA's intra-op thread pool and waits for the
  pieces from inside that same pool. When two solves run at once (a vjp has independent ones) on a machine
  whose pool has two threads, both workers wait on pieces that no thread is left to run, and the process
  hangs for good (jax 0.10.2 on two cores: both ``tf_XLAEigen`` threads in ``ParallelBatchMap``'s wait, the
  caller in ``BlockUntilReady``). Forward substitution runs on the calling thread and cannot wait on itself.

The gradient is written out (a ``custom_vjp``) rather than left to autodiff, so the backward is one more solve
of the transposed system by the same method, and autodiff never keeps one copy of ``X`` per substitution step:
``dR = (I + A)^-T dX``, ``dA = -strict_lower(dR X^T)``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

__all__ = ["PRECISION", "unit_lower_solve"]

# float32 math on every backend: without HIGHEST, XLA runs float32 matmuls in TF32 on recent GPUs (1e-3 error).
PRECISION = lax.Precision.HIGHEST


def _substitute(A: jax.Array, R: jax.Array) -> jax.Array:
    """Forward substitution: row i of X is ``R_i - A_i X`` once rows ``0..i-1`` of X are known.

    X starts at zero, so the diagonal and upper part of `A` meet only zero rows and drop out, as they do for a
    unit-diagonal lower solve.
    """

    def row(i: jax.Array, X: jax.Array) -> jax.Array:
        a_i = lax.dynamic_slice_in_dim(A, i, 1, axis=-2)  # [..., 1, C]
        r_i = lax.dynamic_slice_in_dim(R, i, 1, axis=-2)  # [..., 1, D]
        x_i = r_i - jnp.matmul(a_i, X, precision=PRECISION)
        return lax.dynamic_update_slice_in_dim(X, x_i, i, axis=-2)

    return lax.fori_loop(0, A.shape[-1], row, jnp.zeros_like(R))


def _backend_solve(A: jax.Array, R: jax.Array) -> jax.Array:
    """The backend's triangular solve of ``(I + A) X = R`` (only A's strictly lower part is read)."""
    return lax.linalg.triangular_solve(A, R, left_side=True, lower=True, unit_diagonal=True)


def _solve(A: jax.Array, R: jax.Array) -> jax.Array:
    return lax.platform_dependent(A, R, cpu=_substitute, default=_backend_solve)


def _flip_square(x: jax.Array) -> jax.Array:
    """Reverse both matrix axes: turns a lower-triangular matrix into an upper one and back."""
    return jnp.flip(x, axis=(-2, -1))


@jax.custom_vjp
def unit_lower_solve(A: jax.Array, R: jax.Array) -> jax.Array:
    """Solve ``(I + A) X = R`` for ``X`` ``[..., C, D]``; `A` ``[..., C, C]``, only its strictly lower part read.

    Batched over the leading axes; float32 in, float32 out. Differentiable in `A` and `R`.
    """
    return _solve(A, R)


def _solve_fwd(A: jax.Array, R: jax.Array) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    X = _solve(A, R)
    return X, (A, X)


def _solve_bwd(residuals: tuple[jax.Array, jax.Array], dX: jax.Array) -> tuple[jax.Array, jax.Array]:
    A, X = residuals
    # (I + A)^T is unit upper; reversing the row order of the system makes it unit lower again, with strictly
    # lower part flip(A^T), so the same solver serves: dR = flip(solve(flip(A^T), flip(dX))).
    A_t = jnp.swapaxes(A, -1, -2)
    dR = jnp.flip(_solve(_flip_square(A_t), jnp.flip(dX, axis=-2)), axis=-2)
    dA = -jnp.tril(jnp.matmul(dR, jnp.swapaxes(X, -1, -2), precision=PRECISION), k=-1)
    return dA, dR


unit_lower_solve.defvjp(_solve_fwd, _solve_bwd)
