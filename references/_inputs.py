"""Shared pieces of the seeded input generators.

Two regimes of gates:

* ``typical``: ``g = logsigmoid(randn)``, the decay a trained layer shows (mean decay about 0.5 per token);
* ``long``: ``g ~ U[-0.05, 0]``, long memory, where the state accumulates over hundreds of tokens and
  rounding errors grow with it.
"""

from __future__ import annotations

import torch

REGIMES = ("typical", "long")


def generator(seed: int) -> torch.Generator:
    """A CPU generator seeded with `seed` (inputs are drawn on the CPU, then moved, so a seed means
    the same numbers on every device)."""
    gen = torch.Generator(device="cpu")
    gen.manual_seed(int(seed))
    return gen


def randn(gen: torch.Generator, *shape: int) -> torch.Tensor:
    """Standard normal float32 draw from `gen`."""
    return torch.randn(*shape, generator=gen, dtype=torch.float32)


def l2norm(x: torch.Tensor) -> torch.Tensor:
    """L2-normalise the last dimension, as layers do with q and k."""
    return x / x.norm(dim=-1, keepdim=True).clamp_min(1e-6)


def log_decay(gen: torch.Generator, regime: str, *shape: int) -> torch.Tensor:
    """Draw a float32 log-decay (<= 0) of the given regime."""
    if regime == "typical":
        return torch.nn.functional.logsigmoid(randn(gen, *shape))
    if regime == "long":
        return -0.05 * torch.rand(*shape, generator=gen, dtype=torch.float32)
    raise ValueError(f"unknown gate regime {regime!r}; expected one of {', '.join(REGIMES)}")


def strength(gen: torch.Generator, *shape: int) -> torch.Tensor:
    """A write/erase strength in (0, 1): sigmoid of a normal draw."""
    return torch.sigmoid(randn(gen, *shape))


def state(gen: torch.Generator, B: int, H: int, K: int, V: int) -> torch.Tensor:
    """A random float32 initial state of the size a state reaches in use (entries ~ N(0, 1/K))."""
    return randn(gen, B, H, K, V) * K**-0.5


def finish(
    tensors: dict[str, torch.Tensor],
    *,
    dtype: torch.dtype,
    device: str | torch.device,
    keep_fp32: tuple[str, ...] = ("g", "initial_state"),
) -> dict[str, torch.Tensor]:
    """Cast to the case's dtype (log-decays and the state stay float32) and move to `device`."""
    out = {}
    for name, x in tensors.items():
        out[name] = x.to(device=device, dtype=torch.float32 if name in keep_fp32 else dtype).contiguous()
    return out
