"""Where sdm's dense limit spends its time on a GPU: the whole call beside each of its parts, one process.

At the dense limit (W = S, no key-weighted decay) ``sdm_triton_chunk`` runs gdn's split Triton kernels
(kernels/sdm/triton/dense.py). This script times, each with ``triton.testing.do_bench`` (median, ms), at
B1-T8192-H2 and S = D = W = R = 128 in bf16 by default:

- ``whole``: ``sdm_triton_chunk`` forward, as the suite times it;
- ``densify``: the one kernel that writes the dense key and query and checks the slots on the way (no read back);
- ``gdn``: ``chunk_gated_delta_rule_split`` on those dense tensors;
- ``parts``: densify, gdn, then the flag's one read back, as the call orders them (its copy queued behind the
  densify, read after the GDN kernels are queued);
- ``torch checks``: ``check_slots``, the references' slot checks (a sort, reductions and one read back), for
  the cost the fused kernel's checks replace on this path.

If ``whole`` is near ``parts`` the cost is in the parts (then the largest one is the lever); if ``whole`` is well
over them, the cost is outside (the shape checks, autograd's bookkeeping, the host's launches).

Usage::

    python benchmarks/gpu/sdm_dense_parts.py [--tokens 8192] [--heads 2] [--slots 128]
"""

from __future__ import annotations

import argparse
import sys

import torch


def main(argv: list[str] | None = None) -> int:
    """Time the dense-limit call and its parts; print one line each. Exit 2 without a CUDA device."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--slots", type=int, default=128, help="S = D = W = R")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("sdm_dense_parts.py: needs a CUDA device (do_bench times GPU work)", file=sys.stderr)
        return 2
    from triton.testing import do_bench

    from deltabench.kernels.gdn.triton.chunk_split import chunk_gated_delta_rule_split
    from deltabench.kernels.sdm.triton.dense import _Densify, _flag_reader
    from deltabench.kernels.sdm.triton.triton_chunk import sdm_triton_chunk
    from deltabench.references.sdm import check_slots, make_inputs

    T, H, S = args.tokens, args.heads, args.slots
    x = make_inputs(1, T, H, S, S, S, S, device="cuda", seed=0)
    for name in ("k_val", "q_val", "v", "beta"):
        x[name] = x[name].to(torch.bfloat16)

    def densify() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return _Densify.apply(x["k_idx"], x["k_val"], x["q_idx"], x["q_val"], S)

    k, q, _ = densify()

    def gdn() -> object:
        return chunk_gated_delta_rule_split(q, k, x["v"], x["g"], x["beta"], scale=1.0, output_final_state=True)

    def parts() -> object:
        kk, qq, bad = densify()
        read_bad = _flag_reader(bad)
        out = chunk_gated_delta_rule_split(qq, kk, x["v"], x["g"], x["beta"], scale=1.0, output_final_state=True)
        return out, read_bad()

    def whole() -> object:
        return sdm_triton_chunk(**x)

    def torch_checks() -> None:
        check_slots(x["k_idx"], x["q_idx"], S, allow_repeated_writes=False)

    print(f"sdm dense limit B1-T{T}-H{H}-S{S}-D{S}-W{S}-R{S} bf16 fwd, do_bench medians:")
    times = {}
    steps = (("whole", whole), ("densify", densify), ("gdn", gdn), ("parts", parts), ("torch checks", torch_checks))
    for name, fn in steps:
        times[name] = do_bench(fn, return_mode="median")
        print(f"  {name:12s} {times[name]:.3f} ms", flush=True)
    apart = times["densify"] + times["gdn"]
    print(f"  densify + gdn timed apart: {apart:.3f} ms; whole - that: {times['whole'] - apart:.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
