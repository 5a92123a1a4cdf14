"""state_bwd's launch configs against a float32 torch walk, at few chunks (a diagnostic, not a gate).

Run on the GPU machine::

    python benchmarks/gpu/state_bwd_configs.py

For T = 1, 64, 65, 128, 192 and 640 (1 to 10 chunks), B = 1, H = 2, K = V = 128, bf16 inputs, each config
``(V block, warps, stages)`` of ``state_bwd`` is compared with the same walk written in torch (float32, the
kernel's bf16 roundings of dh and dv_new kept) and prints the relative error of dh, dv_new and dh0. The gate found
dh0 37% off at T = 64 (one chunk) on the H200 with the narrow config (16, 4, 3); a config is suspect when its error
is far above the others' at the same T.
"""

from __future__ import annotations

import os

import torch

from deltabench.kernels.gdn.triton.state import state_bwd
from deltabench.kernels.gdn.triton.wy import CHUNK

CONFIGS = ((64, 8, 1), (64, 4, 2), (16, 4, 3), (16, 4, 2), (64, 4, 3))
TS = tuple(int(t) for t in os.environ.get("TS", "1,64,65,128,192,640").split(","))


def torch_walk(q, k, w, g, do, dht, scale):
    """The backward walk of state.py's docstring in float32: (dh [B,NT,H,K,V], dv_new [B,T,H,V], dh0)."""
    B, T, H, K = q.shape
    V = do.shape[-1]
    NT = -(-T // CHUNK)
    f = lambda x: x.float()
    dH = f(dht).clone()
    dh = torch.empty(B, NT, H, K, V, device=q.device)
    dvn = torch.empty(B, T, H, V, device=q.device)
    for n in reversed(range(NT)):
        s = slice(n * CHUNK, min(T, (n + 1) * CHUNK))
        dh[:, n] = dH.to(q.dtype).float()
        qc, kc, wc, doc = f(q[:, s]), f(k[:, s]), f(w[:, s]), f(do[:, s])
        G = g[:, s].float().cumsum(1)  # [B, c, H]
        Gl = G[:, -1:]
        dG = G[:, None, :, :] - G[:, :, None, :]  # [B, j, i, H]: G_i - G_j
        c = qc.shape[1]
        anti = torch.ones(c, c, device=q.device).triu().bool()[None, :, :, None]
        kq = torch.einsum("bjhk,bihk->bjih", kc, qc)
        MT = torch.where(anti, kq * torch.exp(torch.where(anti, dG, 0.0)), 0.0) * scale
        kdec = (kc * torch.exp(Gl - G)[..., None]).to(q.dtype).float()
        dv = torch.einsum("bjih,bihv->bjhv", MT.to(q.dtype).float(), doc)
        dv = dv + torch.einsum("bjhk,bhkv->bjhv", kdec, dH.to(q.dtype).float())
        dvn[:, s] = dv.to(q.dtype).float()
        qg = (qc * (torch.exp(G) * scale)[..., None]).to(q.dtype).float()
        dH = dH * torch.exp(Gl[:, 0])[..., None, None] + torch.einsum("bihk,bihv->bhkv", qg, doc)
        dH = dH - torch.einsum("bihk,bihv->bhkv", wc, dvn[:, s].to(q.dtype).float())
    return dh, dvn, dH


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """Relative Frobenius error of `a` against `b`."""
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def main() -> None:
    """Print one line per (T, config)."""
    torch.manual_seed(0)
    dev = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU under TRITON_INTERPRET=1 checks the script
    B, H, K, V = 1, 2, 128, 128
    for T in TS:
        q, k, w = (torch.nn.functional.normalize(torch.randn(B, T, H, K, device=dev), dim=-1) for _ in range(3))
        q, k, w = (x.bfloat16() for x in (q, k, w))
        g = -0.05 * torch.rand(B, T, H, device=dev)
        do = torch.randn(B, T, H, V, device=dev).bfloat16()
        dht = torch.randn(B, H, K, V, device=dev)
        ref = torch_walk(q, k, w, g, do, dht, K**-0.5)
        for cfg in CONFIGS:
            out = state_bwd(q, k, w, g, do, dht, K**-0.5, config=cfg)
            if dev == "cuda":
                torch.cuda.synchronize()
            errs = " ".join(f"{n}={rel(a, b):.1e}" for n, a, b in zip(("dh", "dv_new", "dh0"), out, ref, strict=True))
            print(f"T={T:4d} config={cfg}: {errs}", flush=True)


if __name__ == "__main__":
    main()
