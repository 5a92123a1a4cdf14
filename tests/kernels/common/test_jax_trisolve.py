"""The JAX chunked kernels' unit-lower-triangular solve: values and gradients against float64, both solvers, and
no LAPACK trsm on the CPU (the call that can deadlock XLA's thread pool on a two-core machine)."""

from __future__ import annotations

import os
import re

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np
import pytest
import torch

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

from deltabench.kernels.common.jax import jax_trisolve  # noqa: E402

BATCH, C, D = (2, 3), 64, 20


def random_system(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A strictly lower `A` like the UT transform's (entries beta * k_i.k_j * decay, |.| <= 1) and a right side.

    The diagonal and the upper part hold noise: the solver must never read them.
    """
    rng = np.random.default_rng(seed)
    A = rng.uniform(-1.0, 1.0, (*BATCH, C, C)) / np.sqrt(C)
    R = rng.standard_normal((*BATCH, C, D))
    return A.astype(np.float32), R.astype(np.float32)


def float64_solve_and_grads(A: np.ndarray, R: np.ndarray, dX: np.ndarray):
    """X and the gradients of sum(X * dX) in float64, through torch's triangular solve and autograd."""
    a = torch.tensor(A, dtype=torch.float64, requires_grad=True)
    r = torch.tensor(R, dtype=torch.float64, requires_grad=True)
    m = torch.tril(a, diagonal=-1) + torch.eye(C, dtype=torch.float64)
    x = torch.linalg.solve_triangular(m, r, upper=False, unitriangular=True)
    dA, dR = torch.autograd.grad((x * torch.tensor(dX, dtype=torch.float64)).sum(), [a, r])
    return x.detach().numpy(), dA.numpy(), dR.numpy()


def rel(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(np.asarray(got, np.float64) - want) / np.linalg.norm(want))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_values_and_gradients_match_float64(seed: int) -> None:
    A, R = random_system(seed)
    dX = np.random.default_rng(seed + 100).standard_normal(R.shape).astype(np.float32)
    x_want, dA_want, dR_want = float64_solve_and_grads(A, R, dX)

    x, pull = jax.vjp(jax_trisolve.unit_lower_solve, jnp.asarray(A), jnp.asarray(R))
    dA, dR = pull(jnp.asarray(dX))
    # float32 forward substitution over 64 rows against float64 (seen: about 1e-7)
    assert rel(x, x_want) < 1e-5
    assert rel(dR, dR_want) < 1e-5
    assert rel(dA, dA_want) < 1e-5
    # the diagonal and upper part of A are not inputs of the system: their gradient is exactly zero
    assert not np.triu(np.asarray(dA)).any()


def test_cpu_substitution_agrees_with_the_backend_solver() -> None:
    """The two solvers behind the one contract (forward substitution, the backend's trsm) give the same X."""
    A, R = random_system(7)
    a, r = jnp.asarray(A), jnp.asarray(R)
    np.testing.assert_allclose(jax_trisolve._substitute(a, r), jax_trisolve._backend_solve(a, r), rtol=1e-5, atol=1e-5)


def custom_calls(compiled_hlo: str) -> set[str]:
    """The targets of the custom calls in a compiled XLA program's text."""
    return set(re.findall(r'custom_call_target="([^"]+)"', compiled_hlo))


def test_cpu_vjp_calls_no_lapack_trsm() -> None:
    A, R = random_system(3)

    def loss(a: jax.Array, r: jax.Array) -> jax.Array:
        return jnp.sum(jax_trisolve.unit_lower_solve(a, r) ** 2)

    compiled = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(jnp.asarray(A), jnp.asarray(R)).compile().as_text()
    assert not any("trsm" in target for target in custom_calls(compiled))
    # the check sees a trsm when one is there
    backend = jax.jit(jax_trisolve._backend_solve).lower(jnp.asarray(A), jnp.asarray(R)).compile().as_text()
    assert any("trsm" in target for target in custom_calls(backend))
