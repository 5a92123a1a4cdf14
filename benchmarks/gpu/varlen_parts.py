"""Packed sequences against their dense form, impl by impl and kernel by kernel, in one process (a diagnostic,
not a gate: the gated times come from `deltabench run --suite varlen-h200`).

    python benchmarks/gpu/varlen_parts.py [--impls gdn:triton_chunk_auto,gdn:fla_chunk,...] [--heads 16]
        [--seqlens "lognormal(mean=2048, sigma=1.0, total=32768, seed=0)"] [--modes fwd,fwd+bwd] [--kernels 10]
        [--device cuda]

For each impl (as the registry serves it, inputs drawn by the harness as a suite's case, bf16): its packed call
at the drawn lengths, then the same tokens as one dense sequence; each output compared with the first impl's of
the same op (relative max difference: a smoke check, the gate is `deltabench verify --seqlens`); the median time of
each (do_bench, L2 flushed, on a GPU; wall time over a few calls on the CPU) and their ratio, which varlen-h200's
target holds to 1.1 at most; then torch.profiler's device time per kernel of one packed call, the largest first,
beside the dense call's (what the packed path adds is the difference). ``--device cpu`` (under TRITON_INTERPRET=1,
tiny shapes) runs the same code to check it, timing nothing worth reading.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("FLA_FLASH_QLA", "0")
os.environ.setdefault("FLA_TILELANG", "0")

import torch

from deltabench.harness import Case, get_impl, get_op
from deltabench.harness.ops import make_case_inputs
from deltabench.harness.seqlens import draw_seqlens, parse_seqlens

DEFAULT_IMPLS = "gdn:triton_chunk_auto,gdn:fla_chunk,gdn2:triton_chunk,gdn2:fla_chunk,kda:triton_chunk,kda:fla_chunk"


def say(msg: str) -> None:
    """One line of the log, flushed (a device call prints the log's tail as it returns)."""
    print(msg, flush=True)


def lengths_of(spec: str, total: int | None) -> tuple[int, ...]:
    """Explicit lengths (``17,64,1,218``) or a drawn distribution (harness/seqlens.py's syntax)."""
    return parse_seqlens(spec) if spec[0].isdigit() else draw_seqlens(spec, total)[0]


def call_of(op: str, impl: str, case: Case, mode: str):  # type: ignore[no-untyped-def]
    """A no-argument call of `impl` on `case`'s inputs: the forward, or with ``fwd+bwd`` the forward and every
    input's gradient from a fixed output gradient. Returns (call, the forward's output of one call)."""
    fn = get_impl(op, impl)
    x = make_case_inputs(get_op(op), case)
    floating = [n for n, t in x.items() if t.is_floating_point()]
    if mode == "fwd+bwd":
        for n in floating:
            x[n].requires_grad_(True)
    o, _ = fn(**x)
    do = torch.randn_like(o)

    def call() -> object:
        if mode == "fwd":
            with torch.no_grad():
                return fn(**x)
        out, _ = fn(**x)
        return torch.autograd.grad(out, [x[n] for n in floating], do)

    return call, o.detach()


def median_ms(call, device: str) -> float:  # type: ignore[no-untyped-def]
    """do_bench's median on a GPU; on the CPU the median wall time of three calls (ms)."""
    if device == "cuda":
        from triton.testing import do_bench

        return do_bench(call, warmup=25, rep=200, return_mode="median")
    call()
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        call()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def kernel_us(call, device: str) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """Device time per kernel name, us a call (gdn2_triton.py's torch.profiler reading; empty on the CPU)."""
    if device != "cuda":
        return {}
    from gdn2_triton import kernel_times  # this script's folder is first on sys.path

    return dict(kernel_times(lambda: call(), {}))


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """Relative max difference of a against b."""
    return ((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-12)).item()


def main() -> int:
    """Time each impl's packed and dense calls and list the packed call's kernels beside the dense call's."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--impls", default=DEFAULT_IMPLS, help="op:impl,... (the first of an op is its outputs' reference)")
    p.add_argument("--seqlens", default="lognormal(mean=2048, sigma=1.0, total=32768, seed=0)")
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--head-size", type=int, default=128)
    p.add_argument("--modes", default="fwd,fwd+bwd")
    p.add_argument("--kernels", type=int, default=10, help="kernel rows a packed call lists")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--dtype", default="bf16")
    a = p.parse_args()
    try:
        lengths = lengths_of(a.seqlens, None)
        pairs = [tuple(item.split(":")) for item in a.impls.split(",")]
        for op, impl in pairs:
            get_impl(op, impl)
    except Exception as exc:  # a bad spec or an impl that is not there: say so and stop
        p.exit(2, f"varlen_parts.py: {exc}\n")
    T, H, D = sum(lengths), a.heads, a.head_size
    say(f"{len(lengths)} sequences, {T} tokens (shortest {min(lengths)}, longest {max(lengths)}), H={H}, K=V={D}")
    reference: dict[tuple[str, str], torch.Tensor] = {}
    for mode in a.modes.split(","):
        for op, impl in pairs:
            common = {"dtype": a.dtype, "mode": mode, "device": a.device}
            packed_case = Case(op, B=1, T=T, H=H, K=D, V=D, seqlens=lengths, **common)
            dense_case = Case(op, B=1, T=T, H=H, K=D, V=D, **common)
            try:
                packed, o = call_of(op, impl, packed_case, mode)
                dense, _ = call_of(op, impl, dense_case, mode)
            except Exception as exc:  # an impl failing at this shape is a result
                say(f"{mode} {op}:{impl}: {type(exc).__name__}: {str(exc)[:160]}")
                continue
            check = reference.setdefault((mode, op), o)
            p_ms, d_ms = median_ms(packed, a.device), median_ms(dense, a.device)
            say(
                f"{mode} {op}:{impl}: packed {p_ms:.3f} ms, dense {d_ms:.3f} ms, packed / dense {p_ms / d_ms:.2f}"
                f" | o vs first {rel(o, check):.1e}"
            )
            mine, theirs = kernel_us(packed, a.device), kernel_us(dense, a.device)
            for name, us in sorted(mine.items(), key=lambda kv: -kv[1])[: a.kernels]:
                say(f"    {name[:70]:<70} packed {us:9.1f} us, dense {theirs.get(name, 0.0):9.1f} us")
            del packed, dense
            if a.device == "cuda":
                torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
