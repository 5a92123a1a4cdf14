"""The decode adapters on a GPU: each one gated by deltabench's verify at decode shapes, then timed by the decode
timer (runners/decode_timer.py), one table row per (impl, shape).

    python benchmarks/gpu/decode_adapters.py [--impl gdn/flashinfer_decode ...] [--seeds 1]

Shapes: B in 1, 8, 64 and T in 1, 4 new tokens, H = 16, K = V = 128, bf16 inputs, float32 state (``--batch`` and
``--tokens`` change them). Columns: the gate's verdict (its first failures when it fails), the CUDA-graph replay's
microseconds per call (scope call, inputs rotated past L2), a host-synchronised call's, and for FlashInfer the
package's kernel called alone at its own layout with its own gate inputs (``pkg us``: what the adapter's gate
conversion and, for ``flashinfer_mtp``, its state transposes add is ``graph us`` minus it). An impl whose package is
missing prints its reason. Nothing is stored.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
from collections.abc import Callable
from typing import Any

import torch

from deltabench.correctness.engine import verify_case
from deltabench.harness import Case, get_impl
from deltabench.harness.ops import get_op, make_case_inputs, work
from deltabench.kernels.external.flashinfer import flashinfer_gates
from deltabench.runners.decode_timer import time_decode, time_graph_replay
from deltabench.runners.job import failing_summary

DEFAULT_IMPLS = (
    "gdn/triton_decode",
    "gdn/fla_recurrent",
    "gdn/flashinfer_decode",
    "gdn/flashinfer_mtp",
    "gdn/flash_qla",
    "gdn2/triton_decode",
    "gdn2/fla_decode",
    "gdn2/fla_recurrent",
    "kda/triton_decode",
    "kda/fla_decode",
    "kda/fla_recurrent",
)


def _native_calls(name: str, case: Case, copies: int) -> list[Callable[[], Any]] | None:
    """FlashInfer's kernel called directly, `copies` independent input sets at its own layout (None for others)."""
    if name not in ("flashinfer_decode", "flashinfer_mtp"):
        return None
    decode = importlib.import_module("flashinfer.gdn_decode")
    inputs = make_case_inputs(get_op(case.op), case)
    calls = []
    for _ in range(copies):
        x = {n: t.clone() for n, t in inputs.items() if isinstance(t, torch.Tensor)}
        A_log, a, dt_bias, b = flashinfer_gates(x["g"], x["beta"], x["v"].dtype)
        q, k, v = x["q"], x["k"], x["v"]
        if name == "flashinfer_decode":
            state = x["initial_state"].contiguous()

            def call(q=q, k=k, v=v, s=state, A=A_log, a=a, d=dt_bias, b=b) -> Any:
                return decode.gated_delta_rule_decode(q, k, v, s, A, a, d, b, use_qk_l2norm=False, backend="flashinfer")
        else:
            pool = x["initial_state"].transpose(-1, -2).contiguous()
            slots = torch.arange(case.B, dtype=torch.int32, device="cuda")

            def call(q=q, k=k, v=v, p=pool, i=slots, A=A_log, a=a, d=dt_bias, b=b) -> Any:
                return decode.gated_delta_rule_mtp(
                    q, k, v, p, i, A, a, d, b, disable_state_update=False, use_qk_l2norm=False
                )

        calls.append(call)
    return calls


def _row(op: str, name: str, case: Case, seeds: int) -> str:
    impl = get_impl(op, name)
    why = impl.check_case(case)
    if why:
        return f"unsupported: {why}"
    report = verify_case(impl, case, seeds=seeds, extra_seed=False, stop_at_failure=True)
    verdict = "pass" if report.passed else failing_summary(report.records)
    if not report.passed:
        return verdict
    t = time_decode(impl, case)
    pkg = ""
    native = _native_calls(name, case, t.copies)
    if native is not None:
        pkg = f"{statistics.median(time_graph_replay(native, per_replay=t.per_replay, replays=50)):8.2f}"
    gbps = work(case.op, case.dims, case.dtype, "decode")["state_bytes"] / (t.graph_us * 1e-6) / 1e9
    return f"{verdict:5} {t.graph_us:9.2f} {t.host_us:9.2f} {pkg:>8} {gbps:10.0f}"


def main() -> None:
    """Gate and time each decode adapter at each shape; print one row per (impl, shape)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impl", action="append", help="op/impl, repeatable (default: every decode adapter)")
    parser.add_argument("--batch", default="1,8,64", help="batch sizes, comma-separated")
    parser.add_argument("--tokens", default="1,4", help="new tokens per step, comma-separated")
    parser.add_argument("--seeds", type=int, default=1, help="gate seeds per case")
    args = parser.parse_args()
    head = f"{'op/impl':24} {'B':>3} {'T':>2} {'gate':5} {'graph us':>9} {'host us':>9} {'pkg us':>8}"
    print(f"{head} {'state GB/s':>10}")
    for spec in args.impl or DEFAULT_IMPLS:
        op, _, name = spec.partition("/")
        for B in (int(x) for x in args.batch.split(",")):
            for T in (int(x) for x in args.tokens.split(",")):
                case = Case(op, B=B, T=T, H=16, K=128, V=128, dtype="bf16", mode="decode", device="cuda")
                try:
                    line = _row(op, name, case, args.seeds)
                except Exception as exc:  # one adapter's crash is its row; the others still run
                    line = f"error: {type(exc).__name__}: {exc}".splitlines()[0][:200]
                print(f"{spec:24} {B:3d} {T:2d} {line}", flush=True)


if __name__ == "__main__":
    main()
