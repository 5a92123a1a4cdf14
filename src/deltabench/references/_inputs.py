"""Shared pieces of the seeded input generators.

Three regimes of gates:

* ``typical``: ``g = logsigmoid(randn)``, the decay a trained layer shows (mean decay about 0.5 per token);
* ``long``: ``g ~ U[-0.05, 0]``, long memory, where the state accumulates over hundreds of tokens and
  rounding errors grow with it;
* ``strong``: mixed heads. Even heads forget fast, ``g ~ U[-5, -0.5]`` per token (a 64-token chunk sums to about
  -176, so ``exp(-G)`` overflows float32 and a kernel that factors ``exp(G_i - G_j)`` into ``exp(G_i) * exp(-G_j)``
  returns inf or NaN); odd heads barely decay, ``g ~ U[-1e-3, 0]``. Both kinds meet in one call, as in a trained
  model whose heads specialise.

q and k are L2-normalised, as layers do; ``unit_qk=False`` draws them with per-token norms instead (k in
[0.5, 1.2], keeping ``beta * |k|^2 < 2`` so the delta rule stays contractive; q in [0.25, 2]), so that a kernel
normalising them itself is caught.

Where the numbers come from: a generator on the device the inputs are for (:func:`generator`). On the CPU that
is torch's CPU generator, the same numbers on every host. On a GPU the draws are made there, from torch's CUDA
(Philox) generator: the same seed then gives other numbers than on the CPU, and torch's CUDA launch (its grid
follows the GPU's SM count) may give other numbers on another GPU model, so a draw is reproducible from (seed,
:func:`draw_origin`), which the reference cache keys by. A float64 oracle or a comparison sees the very inputs the
impl got either way; drawing on the GPU removes the host draws that were most of a compiled kernel's gate there
(benchmarks/NOTES.md, "Gate cost per job").

Large normal CPU draws are remembered (:func:`randn`): the gate draws the same seed's q, k and v for every regime
and initial-state variant, and a worker's next job at the same shape draws them again (0.25 s per 25M numbers,
one thread).
"""

from __future__ import annotations

import collections
import hashlib
import math
import threading
from collections.abc import Callable

import torch

REGIMES = ("typical", "long", "strong")
# Norm ranges of q and k when they are not unit vectors (see the module docstring).
K_NORMS = (0.5, 1.2)
Q_NORMS = (0.25, 2.0)


def draw_device(device: str | torch.device = "cpu") -> torch.device:
    """Where inputs for `device` are drawn: a CUDA device's own generator, else the CPU's (a TPU case's inputs
    are host tensors)."""
    device = torch.device(device)
    return device if device.type == "cuda" else torch.device("cpu")


def draw_origin(device: str | torch.device = "cpu") -> str:
    """What a seed's draws for `device` depend on beside the seed: ``"cpu"``, or the CUDA generator's device
    type, model and SM count (torch's CUDA draws follow its launch grid, sized by the SM count)."""
    where = draw_device(device)
    if where.type == "cpu":
        return "cpu"
    props = torch.cuda.get_device_properties(where)
    return f"cuda {props.name} {props.multi_processor_count} SMs"


def generator(seed: int, device: str | torch.device = "cpu") -> torch.Generator:
    """A generator seeded with `seed` on :func:`draw_device` of `device` (module docstring: a seed's numbers
    depend on :func:`draw_origin`). Every draw below makes its numbers on the generator's device."""
    gen = torch.Generator(device=draw_device(device))
    gen.manual_seed(int(seed))
    return gen


# Draws of at least this many numbers are remembered, up to DRAW_CACHE_BYTES in all (least recently used first out).
DRAW_CACHE_MIN_NUMEL = 1 << 20
DRAW_CACHE_BYTES = 2 * 2**30
_draws: collections.OrderedDict[tuple, tuple[torch.Tensor, torch.Tensor]] = collections.OrderedDict()
_draws_lock = threading.Lock()


def randn(gen: torch.Generator, *shape: int) -> torch.Tensor:
    """Standard normal float32 draw from `gen`.

    A draw of at least :data:`DRAW_CACHE_MIN_NUMEL` numbers is remembered by the generator's state before it and
    its shape: the same request again returns a copy of the same numbers and leaves `gen` in the state the draw
    left it in, so every later draw is what it would have been (bit for bit: the key is the whole state). Only CPU
    draws are remembered (a GPU draws them in milliseconds)."""
    if math.prod(shape) < DRAW_CACHE_MIN_NUMEL or gen.device.type != "cpu":
        return torch.randn(*shape, generator=gen, dtype=torch.float32, device=gen.device)
    return remembered(gen, ("randn", tuple(shape)), lambda: torch.randn(*shape, generator=gen, dtype=torch.float32))


def remembered(gen: torch.Generator, what: tuple, draw: Callable[[], torch.Tensor]) -> torch.Tensor:
    """``draw()`` (which draws from `gen`), remembered as :func:`randn` remembers its large draws: by `gen`'s
    device, its whole state before it and `what` (the draw's kind and arguments); a hit returns a copy and leaves
    `gen` where the draw left it."""
    key = (str(gen.device), hashlib.blake2b(gen.get_state().numpy().tobytes(), digest_size=16).digest(), what)
    with _draws_lock:
        hit = _draws.get(key)
        if hit is not None:
            _draws.move_to_end(key)
    if hit is not None:
        x, after = hit
        gen.set_state(after)
        return x.clone()  # a caller may write into what it gets
    x = draw()
    entry = (x.clone(), gen.get_state())
    with _draws_lock:
        _draws[key] = entry
        total = sum(t.numel() * t.element_size() for t, _ in _draws.values())
        while total > DRAW_CACHE_BYTES and len(_draws) > 1:
            old, _ = _draws.popitem(last=False)[1]
            total -= old.numel() * old.element_size()
    return x


def l2norm(x: torch.Tensor) -> torch.Tensor:
    """L2-normalise the last dimension, as layers do with q and k."""
    return x / x.norm(dim=-1, keepdim=True).clamp_min(1e-6)


def log_decay(gen: torch.Generator, regime: str, *shape: int) -> torch.Tensor:
    """Draw a float32 log-decay (<= 0) of the given regime."""
    if regime == "typical":
        return torch.nn.functional.logsigmoid(randn(gen, *shape))
    if regime == "long":
        return -0.05 * torch.rand(*shape, generator=gen, dtype=torch.float32, device=gen.device)
    if regime == "strong":
        u = torch.rand(*shape, generator=gen, dtype=torch.float32, device=gen.device)
        strong = -0.5 - 4.5 * u
        near_zero = -1e-3 * u
        head = torch.arange(shape[2], device=gen.device).reshape(
            -1, *([1] * (len(shape) - 3))
        )  # [H, 1...] against [B, T, H, ...]
        return torch.where(head % 2 == 0, strong, near_zero)
    raise ValueError(f"unknown gate regime {regime!r}; expected one of {', '.join(REGIMES)}")


def direction(gen: torch.Generator, *shape: int, norms: tuple[float, float] | None = None) -> torch.Tensor:
    """Random directions over the last dimension: unit vectors, or with per-row norms drawn from U[`norms`]."""
    x = l2norm(randn(gen, *shape))
    if norms is None:
        return x
    lo, hi = norms
    return x * (lo + (hi - lo) * torch.rand(*shape[:-1], 1, generator=gen, dtype=torch.float32, device=gen.device))


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
