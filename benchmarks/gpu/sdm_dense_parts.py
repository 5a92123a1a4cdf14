"""Where sdm's dense limit spends its time on a GPU: the whole call beside each of its parts, one process.

At the dense limit (W = S, no key-weighted decay) ``sdm_triton_chunk`` runs gdn's split Triton kernels
(kernels/sdm/triton/dense.py). On the H200 (2026-12-01 13:56) the call took 1.16 ms forward where the split GDN
forward alone took 0.265 ms at the same tokens: ~0.9 ms outside the GDN kernels. This script times, each with
``triton.testing.do_bench`` (median, ms), at B1-T8192-H2 and S = D = W = R = 128 in bf16 by default:

- ``whole``: ``sdm_triton_chunk`` forward, as the suite times it;
- ``checks``: ``check_sdm_inputs`` (shapes, index range and distinct write slots: a sort and one read back);
- ``densify``: the dense key (a scatter) and the dense query (the fixed-order read-sum kernel);
- ``gdn``: ``chunk_gated_delta_rule_split`` on those dense tensors;
- ``parts``: the three above, one after the other with no read back between them.

If ``whole`` is near ``parts`` the cost is in the parts (then the largest one is the lever); if ``whole`` is well
over the sum of ``checks``, ``densify`` and ``gdn`` timed apart, the host's launches after the read back are
exposed (the GPU idles while Python queues the kernels that follow it).

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
    from deltabench.kernels.gdn.triton.chunk_split import chunk_gated_delta_rule_split
    from deltabench.kernels.sdm.triton.dense import _dense_reads
    from deltabench.kernels.sdm.triton.triton_chunk import sdm_triton_chunk
    from deltabench.references.sdm import check_sdm_inputs, make_inputs
    from triton.testing import do_bench

    T, H, S = args.tokens, args.heads, args.slots
    x = make_inputs(1, T, H, S, S, S, S, device="cuda", seed=0)
    for name in ("k_val", "q_val", "v", "beta"):
        x[name] = x[name].to(torch.bfloat16)
    check_args = [x[n] for n in ("k_idx", "k_val", "q_idx", "q_val", "v", "g", "beta")]

    def checks() -> None:
        check_sdm_inputs(*check_args, None, S)

    def densify() -> tuple[torch.Tensor, torch.Tensor]:
        k = x["k_val"].new_zeros(1, T, H, S).scatter(-1, x["k_idx"].long(), x["k_val"])
        return k, _dense_reads(x["q_idx"], x["q_val"], S)

    k, q = densify()

    def gdn() -> object:
        return chunk_gated_delta_rule_split(q, k, x["v"], x["g"], x["beta"], scale=1.0, output_final_state=True)

    def parts() -> object:
        checks()
        kk, qq = densify()
        return chunk_gated_delta_rule_split(qq, kk, x["v"], x["g"], x["beta"], scale=1.0, output_final_state=True)

    def whole() -> object:
        return sdm_triton_chunk(**x)

    print(f"sdm dense limit B1-T{T}-H{H}-S{S}-D{S}-W{S}-R{S} bf16 fwd, do_bench medians:")
    times = {}
    for name, fn in (("whole", whole), ("checks", checks), ("densify", densify), ("gdn", gdn), ("parts", parts)):
        times[name] = do_bench(fn, return_mode="median")
        print(f"  {name:8s} {times[name]:.3f} ms", flush=True)
    apart = times["checks"] + times["densify"] + times["gdn"]
    print(f"  checks + densify + gdn timed apart: {apart:.3f} ms; whole - that: {times['whole'] - apart:.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
