"""``benchmarks/verify_sweep.sh`` for the GPU: every GPU impl x op x fp32/bf16 over 20 seeds, a child process each.

Run on the GPU machine (a script, not a test)::

    python benchmarks/gpu/verify_sweep.py [--seeds 20] [--impl fla_chunk ...] [--op gdn ...] [--dtype bf16]
        [--shape B=2,T=70,H=3,K=16,V=32 ...] [--wide | --wide-only] [--line-timeout 600] [--jobs 1]
        [--import my_impls.py]

Each line is one ``verify_case`` (the runner's gate): ``--seeds`` consecutive seeds plus one drawn x the op's gate
regimes x with and without an initial state, the non-default scale, q and k off the unit sphere, the input check
and the length sweep, every gradient. Printed as the CPU sweep prints it (worst value over its bound per check
family; 1.00 is at the bound), so both tables read alike.

Each line runs in its own child process (``deltabench verify``'s, :func:`deltabench.correctness.verify_child.
verify_in_child`): a kernel that faults (a CUDA illegal memory access poisons its process's CUDA context), hangs
past ``--line-timeout`` or kills its process fails that line only, with the reason (the exception's first line,
the signal, or the timeout and the phase it was in), and the sweep goes on. The children share Triton's cache and
the reference cache on disk (their directories come from the environment), so a kernel's compiled code and the
oracle's runs are reused across lines and runs; each child pays its interpreter and CUDA start-up (seconds).
``--jobs N`` verifies N lines at once (they share the GPU; each line is printed as it ends).

Shapes, per op (by its dims): B=2,T=70,H=3,K=16,V=32 for gdn, gdn2 and kda, B=1,T=70,H=3,S=64,D=16,W=4,R=4 for sdm.
An impl that cannot take the small shape (e.g. K = V = 128 only) is verified at the wide one instead (K = V = 128;
sdm: D = 128), one that needs an even number of heads (FlashQLA) at the wide one with H = 4, and one that needs T a
multiple of 256 (atomic-ops' chunked paths) at the wide one with T = 256; the line says which shape it ran.
``--shape`` and ``--wide-shape`` (repeatable) replace the defaults of the ops whose dims they name. ``--wide``
verifies every line at the wide shape as well (FLA's kernels target K = V = 128, the train shapes), ``--wide-only``
only there. The summary counts PASS, FAIL and SKIP lines; the exit code is 1 when any line failed, 2 on bad input.
JAX impls' lines start first (they compile for every length the gate calls them at: the Pallas kernels about a
minute a length), so the longest lines never start last; ``--exclude NAME`` leaves an impl out (e.g. one whose build
needs a session of its own).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

# deltabench's own torch and JAX impls are swept on the CPU (benchmarks/verify_sweep.sh); the GPU sweep
# covers the rest: its Triton kernels and every adapter.
CPU_SWEPT = ("torch_recurrent", "torch_chunk", "jax_chunk", "jax_scan")

# (small, wide) default shapes by an op's dims. The small delta-rule shape has K != V and T = 70 (a ragged chunk);
# the wide one is K = V = 128, where FLA's and other third-party kernels have their fast paths.
DEFAULT_SHAPES: dict[tuple[str, ...], tuple[str, str]] = {
    ("B", "T", "H", "K", "V"): ("B=2,T=70,H=3,K=16,V=32", "B=2,T=70,H=3,K=128,V=128"),
    ("B", "T", "H", "S", "D", "W", "R"): ("B=1,T=70,H=3,S=64,D=16,W=4,R=4", "B=1,T=70,H=3,S=1024,D=128,W=8,R=8"),
}


def _family(check: str) -> str:
    return "grad" if check.startswith("grad") else check.split(":")[0]


def _shape_for(op: str, given: list[str], default: str | None, others: list[set[str]]) -> dict[str, int] | None:
    """The dims of `op` from the first of `given` whose dims are all `op`'s, else from `default` (None: none).

    A shape naming only some of `op`'s dims is bad input, unless it names all the dims of an op in `others` with
    fewer dims (gdn's B, T, H, K, V shape is gdn's, not an incomplete shape of gdn_layer, which adds D)."""
    from deltabench.harness.cases import parse_shape
    from deltabench.harness.ops import get_op
    from deltabench.references.contract import parse_dims

    dims = set(get_op(op).dims)
    for text in given:
        named = set(parse_dims(text))
        if not named <= dims:
            continue
        if any(named <= other and len(other) < len(dims) for other in others):
            continue
        return parse_shape(text, op)
    return parse_shape(default, op) if default is not None else None


def _even_heads(dims: dict[str, int] | None) -> dict[str, int] | None:
    """`dims` with an odd H made even (H + 1), or None when there is nothing to change."""
    if dims is None or dims.get("H", 0) % 2 == 0:
        return None
    return {**dims, "H": dims["H"] + 1}


def _whole_blocks(dims: dict[str, int] | None, block: int = 256) -> dict[str, int] | None:
    """`dims` with T rounded up to a multiple of `block` (atomic-ops' chunked paths take T % 256 == 0 only), or
    None when T already is one."""
    if dims is None or "T" not in dims or dims["T"] % block == 0:
        return None
    return {**dims, "T": -(-dims["T"] // block) * block}


def _absolute(spec: str) -> str:
    """A file import as an absolute path (the child may not share the working directory's meaning)."""
    return str(Path(spec).resolve()) if spec.endswith(".py") or Path(spec).is_file() else spec


def _outcome_line(label: str, shape_id: str, outcome: Any, seconds: float) -> tuple[bool, list[str]]:
    """Whether the line passed, and its printed lines: the verdict with worst/bound per family, or the reason."""
    head = f"{label} {shape_id} {seconds:.0f}s"
    if outcome.report is None:
        if outcome.crash is not None:
            # the child layer names the CLI's option; here the limit is this script's
            why = outcome.crash.replace("(--timeout)", "(--line-timeout)")
        elif outcome.bad_input is not None:
            why = f"cannot run: {outcome.bad_input}"
        else:
            why = f"raised {outcome.error} (in {outcome.phase}{', out of memory' if outcome.oom else ''})"
        return False, [f"FAIL {head} {why}"]
    report = outcome.report
    worst: dict[str, float] = {}
    for r in report.records:
        if r.metric == "rel_fro" and r.threshold:
            v = math.inf if r.value is None else r.value / r.threshold
            worst[_family(r.check)] = max(worst.get(_family(r.check), 0.0), v)
    families = " ".join(f"{k}={v:.2f}" for k, v in worst.items())
    lines = [f"{'PASS' if report.passed else 'FAIL'} {head} {len(report.records)} records; worst/bound {families}"]
    lines += [f"     failed: {r.check} {r.metric}={r.value} > {r.threshold} seed={r.seed}" for r in report.failures[:3]]
    return report.passed, lines


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument(
        "--shape", action="append", default=[], help="small shape of the ops whose dims it names (repeatable)"
    )
    parser.add_argument(
        "--wide-shape", action="append", default=[], help="wide shape of the ops whose dims it names (repeatable)"
    )
    wide = parser.add_mutually_exclusive_group()
    wide.add_argument("--wide", action="store_true", help="verify every line at the wide shape as well")
    wide.add_argument("--wide-only", action="store_true", help="verify every line at the wide shape only")
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--impl", action="append", help="impl names (default: all but the CPU-swept ones)")
    parser.add_argument("--exclude", action="append", default=[], help="impl names to leave out")
    parser.add_argument("--op", action="append", help="ops (default: every op)")
    parser.add_argument("--dtype", action="append", choices=("fp32", "bf16"), help="dtypes (default: both)")
    parser.add_argument("--line-timeout", type=float, default=600.0, help="seconds before a line's child is killed")
    parser.add_argument("--jobs", type=int, default=1, help="lines verified at once, a child process each")
    parser.add_argument(
        "--import", dest="imports", action="append", default=[], help="a module or .py file that registers impls"
    )
    args = parser.parse_args(argv)
    if args.seeds < 1:
        parser.error("--seeds must be at least 1")
    if args.line_timeout <= 0:
        parser.error("--line-timeout must be a positive number of seconds")
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    """Verify each selected impl of each op at fp32 and bf16, a child process per line; print one line each and a
    summary; 1 if any line failed, 2 on bad input."""
    args = _parse_args(argv)
    from deltabench.correctness.verify_child import verify_in_child
    from deltabench.harness.cases import Case
    from deltabench.harness.errors import BadInput
    from deltabench.harness.ops import get_op
    from deltabench.harness.registry import all_impls, load_module

    imports = [_absolute(s) for s in args.imports]
    try:
        for spec in imports:  # here to list their impls; each child imports them again
            load_module(spec)
        impls = all_impls()
        shapes: dict[str, tuple[dict[str, int] | None, dict[str, int] | None]] = {}
        ops = list(dict.fromkeys(i.op for i in impls))
        for op in ops:
            small, wide = DEFAULT_SHAPES.get(tuple(get_op(op).dims), (None, None))
            others = [set(get_op(o).dims) for o in ops if o != op]
            shapes[op] = (_shape_for(op, args.shape, small, others), _shape_for(op, args.wide_shape, wide, others))
    except (BadInput, ValueError) as exc:
        print(f"verify_sweep: error: {exc}", file=sys.stderr)
        return 2

    counts = {"PASS": 0, "FAIL": 0, "SKIP": 0}
    lines: list[tuple[str, str, dict[str, Any]]] = []  # (label, shape id, the child's request), in sweep order
    slow: list[bool] = []  # per line: a JAX impl, compiled for each length it is called at (Pallas: a minute each)
    for impl in impls:
        wanted = impl.name in args.impl if args.impl else impl.name not in CPU_SWEPT
        wanted = wanted and impl.name not in args.exclude
        if not wanted or (args.op and impl.op not in args.op) or impl.unavailable_reason(args.device):
            continue
        mode = "fwd+bwd" if impl.supports_backward else "fwd"
        small, wide = shapes[impl.op]
        # for a kernel that needs an even H (FlashQLA), the next H up; for one that needs whole 256-blocks, T so
        wide_alt = [_even_heads(wide), _whole_blocks(wide)]
        # each entry: the shapes to try in turn (the first the impl takes is verified)
        if args.wide_only:
            plan = [[wide, *wide_alt]]
        elif args.wide:
            plan = [[small, wide, *wide_alt], [wide, *wide_alt]]
        else:
            plan = [[small, wide, *wide_alt]]
        for dtype in args.dtype or ("fp32", "bf16"):
            done: set[str] = set()
            for candidates in plan:
                label = f"{impl.op} {impl.name} {dtype}"
                case, why = None, f"no shape for op {impl.op}: give --shape (and --wide-shape) naming its dims"
                for dims in candidates:
                    if dims is None:
                        continue
                    case = Case(op=impl.op, **dims, dtype=dtype, mode=mode, device=args.device)
                    why = impl.check_case(case)
                    if why is None:
                        break
                if why is not None or case is None:
                    counts["SKIP"] += 1
                    print(f"SKIP {label} {why}", flush=True)
                    continue
                if case.shape_id in done:  # the small shape fell back to the wide one, already verified
                    continue
                done.add(case.shape_id)
                request = {
                    "op": impl.op, "impl": impl.name, "dims": dict(case.dims), "dtype": dtype, "seed": 0,
                    "seeds": args.seeds, "regimes": [], "initial_state": False, "mode": mode, "device": args.device,
                    "deterministic": False, "reference": "auto", "imports": imports,
                }  # fmt: skip
                lines.append((label, case.shape_id, request))
                slow.append(impl.backend == "jax")

    # the longest lines start first, so that no line of minutes starts when the others are ending
    lines = [line for _, line in sorted(zip(slow, lines, strict=True), key=lambda p: not p[0])]

    def verify_line(line: tuple[str, str, dict[str, Any]]) -> tuple[bool, list[str]]:
        label, shape_id, request = line
        t0 = time.perf_counter()
        outcome = verify_in_child(request, args.line_timeout)
        return _outcome_line(label, shape_id, outcome, time.perf_counter() - t0)

    # each line is a child process of its own, so lines run side by side with no shared state; printed as they end
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for future in as_completed([pool.submit(verify_line, line) for line in lines]):
            passed, printed = future.result()
            counts["PASS" if passed else "FAIL"] += 1
            print("\n".join(printed), flush=True)
    total = sum(counts.values())
    print(f"{total} line(s): {counts['PASS']} PASS, {counts['FAIL']} FAIL, {counts['SKIP']} SKIP", flush=True)
    return 1 if counts["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())
