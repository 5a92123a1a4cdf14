"""The plan: which shapes, regimes, variants and lengths a correctness gate runs, and where the oracle stops.

The oracle's element limits, the reduced case it checks when the full shape is too costly, the length sweep's
cases, the streaming split, and :func:`gate_shapes` (every shape a gate calls an impl at, for the impls that
compile each shape). Pure planning: nothing here calls an impl.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from deltabench.harness.cases import DECODE_MAX_T, Case, has_backward
from deltabench.harness.errors import BadInput
from deltabench.harness.ops import OpSpec, get_op

from .calls import ALT_SCALE, Variant

__all__ = [
    "LARGEST_CHUNK",
    "ORACLE_MAX_ELEMENTS",
    "ORACLE_MAX_ELEMENTS_GRAD",
    "SHORT_T",
    "SWEEP_B",
    "back_propagates",
    "case_cost",
    "fitting_T",
    "gate_regimes",
    "gate_shapes",
    "gate_variants",
    "oracle_choice",
    "short_case",
    "split_point",
    "split_the_impl_runs",
    "sweep_cases",
    "sweep_chunks",
    "sweep_lengths",
]


# The oracle is a float64 token loop: its cost is B*T*H*K*V element-steps (about 1 s per 1e8 on one CPU core; on
# a GPU, kernel launches, a few per token), and its autograd keeps a few [B,H,K,V] float64 tensors per token (about
# 3 GB at 1e8), so gradients get a lower limit than the forward. The limits are the CPU's, kept for a GPU case too
# so that the reduced case and its records do not depend on where the oracle runs.
ORACLE_MAX_ELEMENTS = 2e8


ORACLE_MAX_ELEMENTS_GRAD = 4e7


SHORT_T = 256  # the oracle's T when the full shape is too costly for it


# The largest chunk any shipped kernel uses: 64 in kernels/gdn/triton (wy.CHUNK), kernels/gdn2/jax/jax_chunk (CHUNK) and
# the torch_chunk impls (chunk_size); FLA's chunked kernels use 64 too.
LARGEST_CHUNK = 64


SWEEP_B = 1  # the length sweep's batch; its other dims are the case's (module docstring)


def split_point(T: int) -> int | None:
    """Where the streaming check splits T tokens: near the middle, never on a multiple of 64 (so both halves
    hold a partial chunk); None when T == 1."""
    if T < 2:
        return None
    t1 = T // 2
    if t1 % LARGEST_CHUNK == 0:
        t1 -= 1
    return t1


def sweep_lengths(T: int, max_chunks: int = SHORT_T // LARGEST_CHUNK) -> list[tuple[int, int | None]]:
    """The length sweep's (T, streaming split) pairs for a case of length `T`.

    T rounded to a multiple of :data:`LARGEST_CHUNK` (at least two chunks, so that a boundary lies inside, and at
    most `max_chunks`, by default those of ``SHORT_T``, so that the oracle stays cheap) split on a chunk boundary;
    one chunk exactly, split in its middle; T = 1 (nothing to split). The lengths reuse one another's shapes (the
    boundary split's halves are one chunk long): a compiling impl (JAX, Triton) compiles few new programs.
    """
    C = LARGEST_CHUNK
    chunks = max(min(round(T / C), max_chunks), 2)
    return [(chunks * C, C * (chunks // 2)), (C, C // 2), (1, None)]


def case_cost(case: Case) -> float:
    return get_op(case.op).cost(case.dims)


def short_case(case: Case, limit: float) -> Case:
    """The case cut down until the oracle can afford it: B to 1 (where the op has a B) and T to the sweep's longest
    length (:func:`sweep_chunks`), then the contract's rule (the delta family's heads, when even two chunks are
    too costly). B and T go first, affordable or not, so that the reduced case is the same for every B and T of the
    job's other dims and its head count the job's wherever the oracle allows (module docstring)."""
    dims = {**case.dims, **({"B": SWEEP_B} if "B" in case.dims else {})}
    short_t = min(case.T, sweep_lengths(case.T, sweep_chunks(case, limit))[0][0])
    return case.replace(**get_op(case.op).shrink(dims, limit, short_t))


def sweep_chunks(case: Case, limit: float) -> int:
    """How many chunks the sweep's longest length may hold: the most, up to ``SHORT_T``, whose oracle run (B = 1,
    the case's other dims) stays within `limit`; two at least, so that a chunk boundary lies inside."""
    spec = get_op(case.op)
    for n in range(SHORT_T // LARGEST_CHUNK, 2, -1):
        dims = {**case.dims, **({"B": SWEEP_B} if "B" in case.dims else {}), "T": n * LARGEST_CHUNK}
        if spec.cost(dims) <= limit:
            return n
    return 2


def fitting_T(T: int, need_a: float, need_b: float, t_a: int, t_b: int, budget: float) -> int:
    """The longest T (`T` itself, else a multiple of :data:`LARGEST_CHUNK`, two chunks at least) whose need, the
    line through ``(t_a, need_a)`` and ``(t_b, need_b)`` (bytes), stays within `budget`."""

    def need(t: int) -> float:
        return need_a + (need_b - need_a) * (t - t_a) / (t_b - t_a)

    if need(T) <= budget:
        return T
    t = (T - 1) // LARGEST_CHUNK * LARGEST_CHUNK
    while t > 2 * LARGEST_CHUNK and need(t) > budget:
        t -= LARGEST_CHUNK
    return max(t, 2 * LARGEST_CHUNK)


def gate_variants(spec: OpSpec, regimes: tuple[str, ...], *, decode: bool = False) -> list[Variant]:
    """The runs of one seed: each regime without and with an initial state; the runs with one pass the
    non-default scale (and are streamed), and the last regime's run without one draws q and k off the unit sphere.
    The runs without an initial state keep the default scale, the arguments the runner times with: a compiling
    impl (JAX, whose ``scale`` is static) reuses that program. A `decode` gate steps from a state in every run
    (a decode step has no stateless call): its first runs keep the default scale instead."""
    out = []
    for i, regime in enumerate(regimes):
        out.append(Variant(regime, h0=decode, unit_qk=i != len(regimes) - 1 or not spec.unit_norm_variant))
        out.append(Variant(regime, h0=True, scale_factor=ALT_SCALE if spec.scale is not None else None))
    return out


def gate_regimes(spec: OpSpec, regimes: str | tuple[str, ...] | list[str] | None) -> tuple[str, ...]:
    known = spec.regimes
    if regimes is None:
        return known
    chosen = (regimes,) if isinstance(regimes, str) else tuple(regimes)
    unknown = [r for r in chosen if r not in known]
    if unknown or not chosen:
        raise BadInput(f"unknown gate regime {', '.join(map(repr, unknown)) or '(none)'}: use {', '.join(known)}")
    return tuple(dict.fromkeys(chosen))


# A decode gate's length sweep: one token, an odd few, and the most a decode step takes.
DECODE_SWEEP_T = (1, 3, DECODE_MAX_T)


def sweep_cases(case: Case, regimes: tuple[str, ...], *, grads: bool, limit: float) -> list[tuple[Case, int | None]]:
    """The length sweep's cases (B = 1, the case's other dims, the long regime where it is run) and their splits;
    a decode case's are :data:`DECODE_SWEEP_T` new tokens, split near their middle."""
    regime = "long" if "long" in regimes else regimes[0]
    batch = {"B": SWEEP_B} if "B" in case.dims else {}
    if case.mode == "decode":
        return [(case.replace(**batch, T=T, regime=regime), T // 2 or None) for T in DECODE_SWEEP_T]
    mode = case.mode if grads else "fwd"
    return [
        (case.replace(**batch, T=T, regime=regime, mode=mode), t1)
        for T, t1 in sweep_lengths(case.T, sweep_chunks(case, limit))
    ]


def back_propagates(impl: Callable[..., Any], case: Case) -> bool:
    """Whether a gate of `impl` at `case` back-propagates: a mode other than ``fwd`` and an impl with a backward."""
    return has_backward(case.mode) and getattr(impl, "supports_backward", True)


def oracle_choice(case: Case, grads: bool, reference: str, oracle_max_elements: float | None) -> tuple[float, bool]:
    """The oracle's element limit for a gate at `case` and whether the oracle takes the full shape (else the chunked
    reference does, and the oracle a reduced case): one rule for :func:`verify_case` and :func:`gate_shapes`."""
    limit = oracle_max_elements or (ORACLE_MAX_ELEMENTS_GRAD if grads else ORACLE_MAX_ELEMENTS)
    return limit, reference == "oracle" or (reference == "auto" and case_cost(case) <= limit)


def split_the_impl_runs(fn: Callable[..., Any], case: Case, t1: int) -> tuple[int | None, str | None]:
    """`t1` when the impl runs both halves; else the split nearest the middle that it runs (an impl whose own
    constraint fixes T to a multiple of its chunk), or ``(None, its reason)`` when there is none."""
    check = getattr(fn, "check_case", None)
    if check is None:
        return t1, None
    first_reason = check(case.replace(T=t1)) or check(case.replace(T=case.T - t1))
    if first_reason is None:
        return t1, None
    for t in sorted(range(1, case.T), key=lambda t: (abs(2 * t - case.T), t)):
        if check(case.replace(T=t)) is None and check(case.replace(T=case.T - t)) is None:
            return t, None
    return None, first_reason


def gate_shapes(
    impl: Callable[..., Any],
    case: Case,
    *,
    regimes: str | tuple[str, ...] | list[str] | None = None,
    reference: str = "auto",
    oracle_max_elements: float | None = None,
) -> list[Case]:
    """The shapes :func:`verify_case` calls `impl` at for `case`, each once, as cases (the regime `case`'s; the mode
    ``fwd`` where no call at that shape back-propagates): the full shape, its streaming halves, the oracle's reduced
    case and the length sweep's lengths with theirs. For impls that compile each new shape, so that a run can
    compile them side by side before the gate (runners/session.py). Not listed: the shorter length at which a GPU
    gate may back-propagate the chunked reference, which it measures on the device (module docstring)."""
    spec = get_op(case.op)
    chosen = gate_regimes(spec, regimes)
    grads = back_propagates(impl, case)
    limit, use_oracle = oracle_choice(case, grads, reference, oracle_max_elements)
    called: list[tuple[Case, int | None]] = [(case, split_point(case.T))]
    if not use_oracle:
        called.append((short_case(case, limit), None))
    called += sweep_cases(case, chosen, grads=grads, limit=limit)
    shapes: dict[str, Case] = {}

    def add(sub: Case, back: bool) -> None:
        mode = case.mode if back or case.mode == "decode" else "fwd"
        sub = sub.replace(regime=case.regime, mode=mode, seed=case.seed)
        if shapes.get(sub.shape_id) is None or back:
            shapes[sub.shape_id] = sub

    for sub, t1 in called:
        add(sub, grads)
        if spec.streaming and t1 is not None and sub.seqlens is None:
            t1, _ = split_the_impl_runs(impl, sub, t1)
            if t1 is not None:
                add(sub.replace(T=t1), False)
                add(sub.replace(T=sub.T - t1), False)
    return list(shapes.values())
