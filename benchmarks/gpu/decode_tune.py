"""Launch sweep for deltabench's Triton decode kernels (kernels/gdn/triton/decode.py, and the decode kernel of
kernels/common/triton/decode.py that gdn2 and kda run), on one GPU.

    python benchmarks/gpu/decode_tune.py [--op gdn|gdn2|kda] [--batch 1,8,64,256,512] [--tokens 1,2,4,8]
        [--kernels chunk,all,prefetch,persist8,...] [--warps 1,2,4,8]

For each (B, T) at H = 16, K = V = 128 (bf16 inputs, float32 state updated in place) every launch of the sweep
(kernel: the tokens as one chunk, every token loaded at once (its decay applied per token or, lazy, once a step),
token by token with the next prefetched, or the persistent kernel at N programs an SM or one program a tile; V
block; warps) is first checked against a float64 step from the same state on the GPU (state rel. Frobenius error <=
1e-4, the bf16 output <= 1e-2), then timed by the decode timer's CUDA-graph replay over enough input copies to
overflow L2 (runners/decode_timer.py), as a run times it. Printed per shape: the current launch (``decode_launch``),
the best of the sweep and its top three, and the state traffic's share of the measured copy ceiling. FLA's kernel is
timed beside ours by the decode-h200 suite, not here. Floor: a step reads and writes B*H*K*V float32 once, whatever
T (2 * 512 * 16 * 128 * 128 * 4 B = 1.07 GB at B = 512: 262 us at 4,099 GB/s); the tokens add under 3% of it.
Nothing is stored: the decisions go to benchmarks/NOTES.md, the published figures come from the decode-h200 suite.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
from collections.abc import Callable
from typing import Any

import torch

from deltabench.kernels.common.triton.decode import launch_delta_decode
from deltabench.kernels.gdn.triton.decode import decode_launch, launch_decode
from deltabench.kernels.gdn2.triton.decode import delta_decode_launch
from deltabench.references.gdn import gdn_recurrent
from deltabench.references.gdn2 import gdn2_recurrent
from deltabench.references.kda import kda_recurrent
from deltabench.runners.ceilings import measure_ceilings
from deltabench.runners.decode_timer import calls_per_replay, rotation_copies, time_graph_replay

H, K, V = 16, 128, 128
SCALE = K**-0.5
# The sweep's kernels by name: launch_decode's `kernel` and, for the shared one ("persist"), programs an SM (0: one
# a tile) and a token's form (fused: both reductions before its update; lazy: the decay applied once a tile)
KERNELS: dict[str, dict[str, Any]] = {
    "chunk": {"kernel": "chunk"},
    "all": {"kernel": "all"},
    "lazy": {"kernel": "lazy"},
    "prefetch": {"kernel": "prefetch"},
    **{f"persist{n}": {"kernel": "persist", "per_sm": n, "fused": True} for n in (4, 8, 16, 32)},
    **{f"persist{n}_plain": {"kernel": "persist", "per_sm": n, "fused": False} for n in (8, 16)},
    "onetile": {"kernel": "persist", "per_sm": 0, "fused": True},
    "onetile_plain": {"kernel": "persist", "per_sm": 0, "fused": False},
    "onetile_lazy": {"kernel": "persist", "per_sm": 0, "fused": False, "lazy": True},
}


# Per op: the oracle, its inputs after q, k, v (with the shape of each past [B, T, H]) and its registered launch
ORACLES = {"gdn": gdn_recurrent, "gdn2": gdn2_recurrent, "kda": kda_recurrent}
GATES = {"gdn": {"g": (), "beta": ()}, "kda": {"g": (K,), "beta": ()}, "gdn2": {"g": (K,), "b": (K,), "w": (V,)}}


def _inputs(op: str, B: int, T: int, seed: int) -> dict[str, torch.Tensor]:
    """A step's inputs on the GPU: bf16 q, k (unit rows), v; float32 gates (log-decays in [-0.1, 0], strengths in
    [0, 1]); a float32 state."""
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device="cuda", generator=gen)

    k = torch.nn.functional.normalize(rand(B, T, H, K), dim=-1)
    x = {"q": rand(B, T, H, K).bfloat16(), "k": k.bfloat16(), "v": rand(B, T, H, V).bfloat16()}
    for name, tail in GATES[op].items():
        u = torch.rand(B, T, H, *tail, device="cuda", generator=gen)
        x[name] = -0.1 * u if name == "g" else u
    return {**x, "state": 0.1 * rand(B, H, K, V)}


def _float64_step(op: str, x: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    args = [x[n].double() for n in ("q", "k", "v", *GATES[op])]
    return ORACLES[op](*args, scale=SCALE, initial_state=x["state"].double())


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b).norm() / b.norm().clamp_min(1e-30))


def _launch(op: str, x: dict[str, torch.Tensor], o: torch.Tensor, launch: dict[str, Any]) -> None:
    """One step of `op` in place: gdn through its own launcher (every kernel), gdn2 and kda through the shared decode
    kernel's."""
    if op == "gdn":
        launch_decode(x["q"], x["k"], x["v"], x["g"], x["beta"], x["state"], o, SCALE, **launch)
        return
    b, w = (x["b"], x["w"]) if op == "gdn2" else (x["beta"], x["beta"])
    extra = {n: launch[n] for n in ("BV", "num_warps", "per_sm", "fused", "lazy") if n in launch}
    launch_delta_decode(x["q"], x["k"], x["v"], x["g"], b, w, x["state"], o, SCALE, **extra)


def _ours(op: str, x: dict[str, torch.Tensor], launch: dict[str, Any]) -> Callable[[], Any]:
    o = torch.empty_like(x["v"])
    return lambda: _launch(op, x, o, launch)


def _time(op: str, launch: dict[str, Any], B: int, T: int) -> float:
    """Median microseconds a call, the calls rotating over enough input copies to overflow L2."""
    step_bytes = 2 * B * H * K * V * 4 + B * T * H * (2 * K + 2 * V) * 2
    copies = rotation_copies(step_bytes, torch.cuda.get_device_properties(0).L2_cache_size)
    calls = [_ours(op, _inputs(op, B, T, seed), launch) for seed in range(copies)]
    return statistics.median(time_graph_replay(calls, per_replay=calls_per_replay(copies), replays=15))


def _current(op: str, B: int, T: int) -> dict[str, Any]:
    """The launch a run takes at (B, T): ``decode_launch``'s for gdn, ``delta_decode_launch``'s otherwise."""
    return decode_launch(B, H, V, T) if op == "gdn" else {"kernel": "persist", **delta_decode_launch(B, H, V, T)}


def _launches(op: str, B: int, T: int, kernels: list[str], warps: list[int]) -> list[dict[str, Any]]:
    """The sweep's launches at (B, T), the current one first (gdn2 and kda: the shared decode kernel's alone)."""
    blocks = (8, 16, 32, 64) if B <= 8 else (16, 32, 64)
    current = _current(op, B, T)
    if op != "gdn":
        kernels = [name for name in kernels if KERNELS[name]["kernel"] == "persist"]
    swept = [{"BV": BV, "num_warps": w, **KERNELS[name]} for BV, w, name in itertools.product(blocks, warps, kernels)]
    return [current, *(launch for launch in swept if launch != current)]


def _name(launch: dict[str, Any]) -> str:
    kernel = launch["kernel"]
    if kernel == "persist":
        kernel = f"persist{launch['per_sm']}" if launch["per_sm"] else "onetile"
        kernel += "l" if launch.get("lazy") else "" if launch["fused"] else "p"
    return f"{kernel} BV{launch['BV']} w{launch['num_warps']}"


def sweep(op: str, B: int, T: int, kernels: list[str], warps: list[int]) -> list[dict[str, Any]]:
    """Every launch of the sweep that passes its check at (B, T), with its microseconds, fastest first."""
    rows = []
    ref_o, ref_s = _float64_step(op, _inputs(op, B, T, 12345))
    for launch in _launches(op, B, T, kernels, warps):
        x = _inputs(op, B, T, 12345)
        o = torch.empty_like(x["v"])
        _launch(op, x, o, launch)
        o_err, s_err = _rel(o.float(), ref_o), _rel(x["state"], ref_s)
        if not (o_err <= 1e-2 and s_err <= 1e-4):  # o is bf16: its rounding alone is ~3e-3
            print(f"  B{B} T{T} {launch}: WRONG o {o_err:.1e} state {s_err:.1e}", flush=True)
            continue
        rows.append({**launch, "us": _time(op, launch, B, T)})
        print(f"  B{B} T{T} {_name(launch)}: {rows[-1]['us']:.2f} us", flush=True)
    return sorted(rows, key=lambda r: r["us"])


def main() -> None:
    """Sweep each shape and print the current launch, the best one and FLA's time."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", default="1,8,64,256,512")
    parser.add_argument("--tokens", default="1,2,4,8")
    parser.add_argument("--op", default="gdn", choices=sorted(ORACLES))
    parser.add_argument("--kernels", default="chunk,all,prefetch", help=f"of {', '.join(KERNELS)}")
    parser.add_argument("--warps", default="1,2,4,8")
    args = parser.parse_args()
    kernels, warps = args.kernels.split(","), [int(w) for w in args.warps.split(",")]
    if unknown := set(kernels) - set(KERNELS):
        parser.error(f"unknown kernels {sorted(unknown)}: of {', '.join(KERNELS)}")
    copy_gbps = measure_ceilings("cuda")["copy_gbps"]
    print(f"copy ceiling {copy_gbps:.0f} GB/s (read+write)")
    print(f"{'B':>4} {'T':>2} {'current us':>10} {'best us':>8} {'best launch':34} {'% copy':>6}  top 3")
    for B, T in itertools.product((int(b) for b in args.batch.split(",")), (int(t) for t in args.tokens.split(","))):
        rows = sweep(args.op, B, T, kernels, warps)
        current = _current(args.op, B, T)
        now = next((r["us"] for r in rows if all(r.get(n) == current[n] for n in current)), float("nan"))
        best = rows[0]
        pct = 100 * 2 * B * H * K * V * 4 / (best["us"] * 1e-6) / (copy_gbps * 1e9)
        launch = _name(best)
        top = ", ".join(f"{_name(r)} {r['us']:.2f}" for r in rows[:3])
        print(f"{B:4d} {T:2d} {now:10.2f} {best['us']:8.2f} {launch:34} {pct:6.0f}  {top}", flush=True)


if __name__ == "__main__":
    main()
