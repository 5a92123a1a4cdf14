"""Where the seeded inputs are drawn (references/_inputs.py): a CPU case's numbers are torch's CPU generator's, bit
for bit as before the draws could be made on a GPU; a CUDA case's generator is on its device; remembered draws
are keyed by the generator's device."""

from __future__ import annotations

import torch

from deltabench.references import _inputs
from deltabench.references.gdn import make_inputs


def test_a_cuda_case_draws_on_its_device_and_any_other_on_the_cpu() -> None:
    assert _inputs.draw_device("cuda:1") == torch.device("cuda:1")
    assert _inputs.draw_device("cuda") == torch.device("cuda")
    assert _inputs.draw_device("cpu") == torch.device("cpu")
    assert _inputs.draw_origin("cpu") == "cpu"
    assert _inputs.generator(3).device == torch.device("cpu")


def test_cpu_draws_are_the_cpu_generators_numbers_in_the_documented_order() -> None:
    # Reproducible inputs for a recorded seed: q, k, v, then the gates, from one CPU generator seeded with it.
    B, T, H, K, V = 1, 1024, 8, 128, 16  # q and k are remembered draws (2**20 numbers), v is not
    got = make_inputs(B, T, H, K, V, seed=11, regime="long", initial_state=True, device="cpu")
    gen = torch.Generator(device="cpu").manual_seed(11)
    q, k, v = (torch.randn(B, T, H, d, generator=gen) for d in (K, K, V))
    g = -0.05 * torch.rand(B, T, H, generator=gen)
    beta = torch.sigmoid(torch.randn(B, T, H, generator=gen))
    h0 = torch.randn(B, H, K, V, generator=gen) * K**-0.5
    assert torch.equal(got["q"], _inputs.l2norm(q))
    assert torch.equal(got["k"], _inputs.l2norm(k))
    for name, want in (("v", v), ("g", g), ("beta", beta), ("initial_state", h0)):
        assert torch.equal(got[name], want), name


def test_remembered_draws_are_keyed_by_the_generators_device() -> None:
    _inputs._draws.clear()
    _inputs.randn(_inputs.generator(4, "cpu"), 1, 1024, 8, 128)
    assert [key[0] for key in _inputs._draws] == ["cpu"]
