"""The references a run is compared against: the float64 oracle, stacked along B, and the fp32 chunked reference.

The oracle runs on :func:`oracle_device`; its runs are shared with every impl gated on the same draws through the
on-disk reference cache (correctness/reference_cache.py). Where the oracle is too costly at the full shape, the
op's ``torch_chunk`` in fp32 is the reference there (:func:`chunk_run`), its backward at the longest T that fits
(:func:`chunk_grad_T`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from deltabench.harness.cases import Case
from deltabench.harness.devices import allocator_fraction, device_share
from deltabench.harness.ops import OpSpec, make_case_inputs
from deltabench.references._inputs import draw_device, draw_origin
from deltabench.references._varlen import by_sequence

from .calls import Item, Run, call_impl, call_kwargs, call_options, draw_cotangents, fp32_inputs
from .plan import LARGEST_CHUNK, ORACLE_MAX_ELEMENTS, case_cost, fitting_T
from .reference_cache import cached_reference

__all__ = [
    "GRAD_REFERENCE_MEMORY_SHARE",
    "chunk_grad_T",
    "chunk_reference",
    "chunk_run",
    "oracle_device",
    "oracle_runs",
    "stack_limit",
    "stacks_onto",
]


# The share of the device memory free at the decision that the chunked reference's backward may take (the impl's
# and the reference's full-shape runs, the allocator's slack and the extrapolation's error take the rest).
GRAD_REFERENCE_MEMORY_SHARE = 0.5


def oracle_device(case: Case) -> torch.device:
    """Where the float64 oracle runs for `case`: its GPU for a CUDA case (IEEE float64 there too, without the
    host's token loop and the inputs' copies to the host), else the CPU."""
    return draw_device(case.torch_device)


def chunk_grad_T(case: Case, spec: OpSpec) -> int:
    """The longest T at which the chunked reference's forward and backward fit in the device memory free now.

    On a GPU its peak (what autograd keeps grows with T, one set per chunk) is measured at two and four chunks of
    the case's other dims and extrapolated along T, against :data:`GRAD_REFERENCE_MEMORY_SHARE` of the free memory
    (at most of this process's share of the device, :func:`deltabench.harness.devices.allocator_fraction`):
    sdm's flagship (S = 65536, D = 1024) keeps about 1.75 GiB a chunk, 220 GiB at T = 8192. On the CPU the host
    memory check (correctness/memory_need.py) has judged the case already: the full T."""
    if not case.torch_device.startswith("cuda") or case.T <= 4 * LARGEST_CHUNK:
        return case.T
    dev = case.torch_device
    peaks = []
    for t in (2 * LARGEST_CHUNK, 4 * LARGEST_CHUNK):
        sub = case.replace(T=t, initial_state=True)
        inputs = make_case_inputs(spec, sub)
        cot = draw_cotangents(spec, sub, case.seed)
        torch.cuda.synchronize(dev)
        before = torch.cuda.memory_allocated(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        call_impl(chunk_reference(case), spec, fp32_inputs(inputs), (cot[0].float(), cot[1]))
        torch.cuda.synchronize(dev)
        peaks.append(torch.cuda.max_memory_allocated(dev) - before)
    free, total = torch.cuda.mem_get_info(dev)
    mine = free + torch.cuda.memory_reserved(dev) - torch.cuda.memory_allocated(dev)
    # gates side by side (--gate-workers) would each see the same free memory: each takes its share of the device
    budget = GRAD_REFERENCE_MEMORY_SHARE * min(mine, allocator_fraction(device_share(), total) * total)
    return fitting_T(case.T, peaks[0], peaks[1], 2 * LARGEST_CHUNK, 4 * LARGEST_CHUNK, budget)


def chunk_reference(case: Case) -> Callable[..., Any]:
    """The op's full-shape reference impl (its contract's ``reference_impl``: the delta family's torch_chunk)."""
    from deltabench.harness.ops import get_op
    from deltabench.harness.registry import get_impl

    return get_impl(case.op, get_op(case.op).reference_impl)


def oracle_runs(spec: OpSpec, items: list[Item], limit: float) -> list[Run]:
    """The float64 oracle on every item's inputs, in as few calls as `limit` (B*T*H*K*V per call; on a GPU at
    least the forward's, :func:`stack_limit`) allows.

    The oracle's cost is a Python loop over tokens, nearly independent of B at the gate's sizes, so the items are
    stacked along B: a zero initial state where an item has none (its gradient dropped), each item's scale
    applied to its q (``o`` is linear in ``scale * q``), and, where the op allows it, shorter sequences padded
    to the longest with identity tokens (zero inputs and gates, a zero cotangent).
    """
    groups: list[list[int]] = []
    for i, it in enumerate(items):
        if groups and stacks_onto(spec, [items[j] for j in groups[-1]], it, limit):
            groups[-1].append(i)
        else:
            groups.append([i])
    runs: list[Run | None] = [None] * len(items)
    for g in groups:
        group = [items[i] for i in g]
        compute = _oracle_packed if group[0].case.seqlens is not None else _oracle_stacked
        for i, run in zip(
            g, _shared_runs("oracle", group, lambda group=group, compute=compute: compute(spec, group)), strict=True
        ):
            runs[i] = run
    return [r for r in runs if r is not None]


def stacks_onto(spec: OpSpec, group: list[Item], it: Item, limit: float) -> bool:
    """Whether `it` joins `group` in one stacked oracle call (:func:`oracle_runs`; `limit` as given there)."""
    if group[0].case.seqlens is not None or it.case.seqlens is not None:
        return False  # packed sequences: each run its own oracle call (_oracle_packed)
    if _stack_key(group[0]) != _stack_key(it):
        return False
    if not spec.zero_token_is_identity and group[0].case.T != it.case.T:
        return False
    T = max(x.case.T for x in [*group, it])
    stacked = it.case.replace(B=sum(x.case.B for x in [*group, it]), T=T)
    return case_cost(stacked) <= stack_limit(group[0].case, limit)


def stack_limit(case: Case, limit: float) -> float:
    """How large one stacked oracle call may be: `limit` on the CPU (its time per element, its memory for
    autograd); on a GPU, where a call's time is its kernel launches (a few per token, whatever B), at least the
    forward's :data:`ORACLE_MAX_ELEMENTS` (a few GB of autograd memory), so that a case's runs with gradients take
    a few calls rather than one each. The reduced case itself still follows `limit` (module docstring)."""
    return limit if oracle_device(case).type == "cpu" else max(limit, ORACLE_MAX_ELEMENTS)


def _shared_runs(kind: str, items: list[Item], compute: Callable[[], list[Run]]) -> list[Run]:
    """The reference runs of `items`, shared with every impl gated on the same case through the on-disk cache
    (correctness/reference_cache.py). The key names each item's draw (its B, T, seed, regime, initial state, scale
    and q/k norm), so two calls that share a key ran the reference on identical inputs."""
    draws = ";".join(
        f"B{it.case.B},T{it.case.T},s{it.seed},{it.case.regime},h{int(it.variant.h0)},{it.variant.label()}"
        for it in items
    )
    packed = [it.case.seqlens for it in items if it.case.seqlens is not None]
    if packed:  # the sequences' lengths decide the reference as much as the draws do
        draws += ";seqlens " + "|".join(".".join(map(str, lengths)) for lengths in packed)
    origin = draw_origin(items[0].case.torch_device)
    if origin != "cpu":  # the draws, and so the reference, depend on the generator's device (references/_inputs.py)
        draws += f";drawn on {origin}"
    grads = items[0].cot is not None
    if grads and not bool(items[0].cot[1].any()):  # an impl declared state_grad=False: the output's cotangent alone
        draws += ";no state cotangent"
    flat = cached_reference(
        items[0].case,
        kind=kind,
        draws=draws,
        grads=grads,
        compute=lambda: {f"{i}/{n}": t for i, run in enumerate(compute()) for n, t in run.tensors().items()},
    )
    runs = []
    for i in range(len(items)):
        mine = {n.split("/", 1)[1]: t for n, t in flat.items() if n.split("/", 1)[0] == str(i)}
        grad_of = {n[len("grad:") :]: t for n, t in mine.items() if n.startswith("grad:")}
        runs.append(Run(o=mine["o"], state=mine["final_state"], grads=grad_of))
    return runs


def _stack_key(item: Item) -> tuple[Any, ...]:
    """Items stack along B when every dim but B and T agrees (and both are, or are not, back-propagated)."""
    options = tuple(sorted(call_options(item.inputs).items()))
    return (*(v for d, v in item.case.dims.items() if d not in ("B", "T")), options, item.cot is not None)


def _padded(x: torch.Tensor, T: int) -> torch.Tensor:
    """`x` [B, t, ...] padded with zeros along dim 1 to T tokens."""
    if x.shape[1] == T:
        return x
    return torch.cat([x, x.new_zeros(x.shape[0], T - x.shape[1], *x.shape[2:])], dim=1)


def _oracle_stacked(spec: OpSpec, items: list[Item]) -> list[Run]:
    """One oracle call on `items` stacked along B (see :func:`oracle_runs`), on :func:`oracle_device`: the
    same code on either device, only where its tensors live differs."""
    T = max(it.case.T for it in items)
    dev = oracle_device(items[0].case)

    def on_dev(x: torch.Tensor) -> torch.Tensor:
        return x.detach().to(dev, torch.float64) if x.is_floating_point() else x.detach().to(dev)

    def row(it: Item, n: str) -> torch.Tensor:
        return _padded(on_dev(it.inputs[n]), T) if spec.arg(n).sequence else on_dev(it.inputs[n])

    stacked = {n: torch.cat([row(it, n) for it in items]) for n in spec.args}
    states = []
    for it in items:
        h0 = it.inputs.get(spec.state_arg)
        zeros = torch.zeros(*spec.state.shape(it.case.dims), dtype=torch.float64, device=dev)
        states.append(on_dev(h0) if h0 is not None else zeros)
    stacked[spec.state_arg] = torch.cat(states)
    stacked.update(call_options(items[0].inputs))  # the same for every stacked item (_stack_key)
    ratio = torch.tensor(
        [1.0 if it.variant.scale_factor is None else it.variant.scale_factor for it in items for _ in range(it.case.B)],
        dtype=torch.float64,
        device=dev,
    )
    scaled = None if spec.scale is None else spec.args.index(spec.scale[0])

    def oracle(*args: torch.Tensor, **kwargs: Any) -> Any:
        # o is linear in scale * q: each stacked row's own scale is applied to its q, the oracle given the default.
        if scaled is not None:
            args = tuple(x * ratio.reshape(-1, *[1] * (x.dim() - 1)) if i == scaled else x for i, x in enumerate(args))
        options = {n: x for n, x in kwargs.items() if n not in (spec.state_arg, "scale")}
        return spec.oracle(*args, **call_kwargs(spec, None, kwargs[spec.state_arg]), **options)

    cot = None
    if items[0].cot is not None:
        cot = (
            torch.cat([_padded(on_dev(it.cot[0]), T) for it in items]),
            torch.cat([on_dev(it.cot[1]) for it in items]),
        )
    whole = call_impl(oracle, spec, stacked, cot)
    runs, row = [], 0
    for it in items:
        rows, t = slice(row, row + it.case.B), it.case.T
        row += it.case.B
        grads = {
            n: (None if x is None else x[rows, :t] if spec.arg(n).sequence else x[rows]) for n, x in whole.grads.items()
        }
        if not it.variant.h0:
            grads.pop(spec.state_arg, None)
        runs.append(Run(o=whole.o[rows, :t], state=whole.state[rows], grads=grads))
    return runs


def _oracle_packed(spec: OpSpec, items: list[Item]) -> list[Run]:
    """The oracle on one run of packed sequences (``items`` holds one): each sequence alone from its own state
    row (references/_varlen.by_sequence), on :func:`oracle_device`, at the run's own scale."""
    (it,) = items
    dev = oracle_device(it.case)

    def on_dev(x: Any) -> Any:
        if not isinstance(x, torch.Tensor):
            return x
        return x.detach().to(dev, torch.float64) if x.is_floating_point() else x.detach().to(dev)

    inputs = {n: on_dev(x) for n, x in it.inputs.items()}
    cot = None if it.cot is None else (on_dev(it.cot[0]), on_dev(it.cot[1]))
    return [call_impl(by_sequence(spec), spec, inputs, cot, scale=it.variant.scale(spec, it.case.dims))]


def chunk_run(case: Case, spec: OpSpec, item: Item) -> Run:
    """The op's torch_chunk in fp32 on the item's inputs (the full-shape reference when the oracle is too costly),
    back-propagated when the item carries cotangents."""
    ref_cot = (
        None if item.cot is None else (item.cot[0].float().to(case.torch_device), item.cot[1].to(case.torch_device))
    )

    def compute() -> list[Run]:
        chunk = chunk_reference(case)
        return [call_impl(chunk, spec, fp32_inputs(item.inputs), ref_cot, scale=item.variant.scale(spec, case.dims))]

    (run,) = _shared_runs("torch_chunk", [item], compute)
    return run
