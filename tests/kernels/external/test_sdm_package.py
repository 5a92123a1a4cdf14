"""The sparse-delta-memory 2.0.0 adapter (kernels/external/sdm.py).

The package runs on CUDA only (no CPU path: its op, decode step and top-k refuse CPU tensors, its op and top-k build
CUDA extensions), so on the CPU the adapter's mapping (streams, bank rows, gates, dtypes, the bank copy) is gated
through a stand-in module written here from the package's documented contract (a float64 token loop over its 2-D
bank with global row ids), and planted mapping bugs are shown to fail. The real wheel, where one is found
(``DELTABENCH_SDM_WHEEL``, default /tmp/sdmw/...), is unpacked into a temporary folder on ``sys.path``: its import
(or its failure, the impl's reason) is checked here, and on a CUDA machine where it imports it is gated against the
oracle like any impl.
"""

from __future__ import annotations

import os
import sys
import textwrap
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from deltabench.correctness.engine import verify_case
from deltabench.harness import registry
from deltabench.harness.cases import Case
from deltabench.kernels.external import sdm as adapter
from deltabench.kernels.sdm import pk_topk_torch, sdm_decode_step
from deltabench.references import sdm as ref

SHAPE = {"B": 2, "T": 70, "H": 2, "S": 16, "D": 4, "W": 3, "R": 3}
WHEEL = Path(os.environ.get("DELTABENCH_SDM_WHEEL", "/tmp/sdmw/sparse_delta_memory-2.0.0-py3-none-any.whl"))

# The stand-in: sparse-delta-memory's documented call convention (memory_ops.sdm_write_read's and
# decode.sdm_decode_step's docstrings), computed token by token in float64. It checks what the adapter must hand
# over (stream-major [P, T, ...] inputs, rows inside each stream's range, gates [..., 1] or [..., W] in float32)
# and, like the package, advances `memory` in place and returns the readings [P*T, D] in the bank's dtype.
_STAND_IN = """
import torch


def _advance(memory, k_idx, k_val, v, beta, g, q_idx, q_val, num_memory_slots, num_parallel, key_weighted_decay):
    P, T, W = k_idx.shape
    assert memory.dim() == 2 and memory.dtype in (torch.float32, torch.bfloat16) and memory.is_contiguous()
    assert num_parallel == P and memory.shape[0] == P * num_memory_slots
    assert beta.shape == (P, T, 1) and beta.dtype == torch.float32 and g.dtype == torch.float32
    assert g.shape == (P, T, W if key_weighted_decay else 1)
    low = torch.arange(P).view(P, 1, 1) * num_memory_slots
    for idx in (k_idx, q_idx):
        assert bool(((idx >= low) & (idx < low + num_memory_slots)).all()), "a row outside its stream's range"
    M = memory.double()
    ys = []
    for t in range(T):
        rows, kv = k_idx[:, t], k_val[:, t].double()
        read = M[rows] * g[:, t].double().exp()[..., None]
        u = beta[:, t].double() * (v[:, t].double() - (kv[..., None] * read).sum(1))
        M = M.index_put((rows.reshape(-1),), (read + kv[..., None] * u[:, None, :]).reshape(-1, M.shape[1]))
        ys.append((q_val[:, t].double()[..., None] * M[q_idx[:, t]]).sum(1))
    with torch.no_grad():
        memory.copy_(M)
    return torch.stack(ys, 1).reshape(P * T, -1).to(memory.dtype)
"""
_MEMORY_OPS = (
    _STAND_IN
    + """

def sdm_write_read(memory, k_idx, k_val, v, beta, g, q_idx, q_val, *, chunk_size=64, num_memory_slots=0,
                   num_parallel=1, snapshot_quant="none", key_weighted_decay=None, shared_bank=False,
                   grad_bank_fp32=False):
    assert 16 <= chunk_size <= 256
    return _advance(memory, k_idx, k_val, v, beta, g, q_idx, q_val, num_memory_slots, num_parallel,
                    bool(key_weighted_decay))
"""
)
_DECODE = """
from .memory_ops import _advance


def sdm_decode_step(memory, k_idx, k_val, v, beta, g, q_idx, q_val):
    P = k_idx.shape[0]
    return _advance(memory, k_idx, k_val, v, beta, g, q_idx, q_val, memory.shape[0] // P, P,
                    g.shape[-1] == k_idx.shape[-1] and k_idx.shape[-1] > 1)
"""


def _install(root: Path, files: dict[str, str]) -> None:
    pkg = root / "sparse_delta_memory"
    pkg.mkdir(parents=True)
    for name, text in files.items():
        (pkg / name).write_text(textwrap.dedent(text))


def _forget_package() -> None:
    for name in [m for m in sys.modules if m.split(".")[0] == "sparse_delta_memory"]:
        del sys.modules[name]
    adapter.import_failure.cache_clear()


@pytest.fixture
def stand_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The stand-in package importable as ``sparse_delta_memory`` for the test's duration."""
    _install(tmp_path, {"__init__.py": "", "memory_ops.py": _MEMORY_OPS, "decode.py": _DECODE})
    _forget_package()
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    _forget_package()


def _declared(fn):  # type: ignore[no-untyped-def]
    """`fn` with the adapter impl's declaration as the gate reads it (its final state has no gradient)."""

    def impl(*args, **kwargs):  # type: ignore[no-untyped-def]
        return fn(*args, **kwargs)

    impl.state_grad = False  # type: ignore[attr-defined]
    return impl


def _gate(fn, *, dtype: str = "fp32", regimes=None):  # type: ignore[no-untyped-def]
    case = Case("sdm", **SHAPE, dtype=dtype, mode="fwd+bwd")
    return verify_case(fn, case, seeds=1, extra_seed=False, regimes=regimes)


def _failures(report) -> set[str]:  # type: ignore[no-untyped-def]
    return {r.check for r in report.failures}


# ------------------------------------------------------------------------------------------- the mapping, on the CPU


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_the_adapter_mapping_passes_the_gate_in_every_regime(stand_in: None, dtype: str) -> None:
    report = _gate(_declared(adapter.sdm_package_chunk), dtype=dtype)
    assert report.passed, [f"{r.check} {r.regime} {r.detail}" for r in report.failures]
    assert {r.regime for r in report.records if r.check == "grad:k_val"} == set(ref.SDM_REGIMES)
    assert any(r.check == "grad:initial_bank" and r.passed for r in report.records)
    (note,) = [r for r in report.records if r.check == "gradients"]
    assert not note.gating and "output alone" in note.detail


def test_without_its_declaration_the_detached_final_bank_fails_the_gradients(stand_in: None) -> None:
    """The gate's cotangent on the final bank reaches the oracle's gradients but not the package's: declared
    ``state_grad=True`` the same adapter fails, which is why the impl declares it."""
    report = _gate(adapter.sdm_package_chunk, regimes=["typical"])
    failed = _failures(report)
    assert failed and all(c.startswith("grad:") for c in failed), failed


def test_planted_mapping_bugs_are_rejected(stand_in: None, monkeypatch: pytest.MonkeyPatch) -> None:
    streams = adapter._streams

    def heads_major(x: torch.Tensor) -> torch.Tensor:  # stream h B + b instead of b H + h
        B, T, H = x.shape[:3]
        return x.permute(2, 0, 1, *range(3, x.dim())).reshape(B * H, T, *x.shape[3:]).contiguous()

    monkeypatch.setattr(adapter, "_streams", heads_major)
    assert "output" in _failures(_gate(_declared(adapter.sdm_package_chunk), regimes=["typical"]))
    monkeypatch.setattr(adapter, "_streams", streams)

    # key-weighted decay dropped: g handed over per token whatever the option
    orig = adapter.sdm_package_chunk

    def no_kwd(*args, **kwargs):  # type: ignore[no-untyped-def]
        kwargs["key_weighted_decay"] = False
        return orig(*args, **kwargs)

    report = _gate(_declared(no_kwd), regimes=["typical", "key_weighted"])
    assert {r.regime for r in report.failures} == {"key_weighted"}


def test_the_final_bank_is_a_copy_the_backward_cannot_touch(stand_in: None) -> None:
    """The package's backward restores its bank in place: the state handed back must not be that tensor."""
    x = ref.make_inputs(1, 10, 2, 8, 4, 2, 2, seed=3, initial_bank=True)
    seen: list[torch.Tensor] = []
    import sparse_delta_memory.memory_ops as ops

    real = ops.sdm_write_read

    def remember(memory, *args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(memory)
        return real(memory, *args, **kwargs)

    ops.sdm_write_read = remember
    _, bank = adapter.sdm_package_chunk(**x)
    assert seen and bank.data_ptr() != seen[0].data_ptr()
    seen[0].zero_()  # what a restore does to the package's tensor
    assert bank.abs().sum() > 0
    torch.testing.assert_close(bank.double(), ref.sdm_recurrent(**x)[1], rtol=1e-5, atol=1e-6)


def test_decode_step_matches_deltabench_decode(stand_in: None) -> None:
    for kwd in (False, True):
        x = ref.make_inputs(
            2, 1, 3, 16, 4, 3, 2, seed=5, initial_bank=True, regime="key_weighted" if kwd else "typical"
        )
        args = [x[n][:, 0] for n in ("k_idx", "k_val", "q_idx", "q_val", "v", "g", "beta")]
        y, bank = adapter.sdm_decode_step_package(*args, x["initial_bank"], key_weighted_decay=kwd)
        y_ref, bank_ref = sdm_decode_step(*args, x["initial_bank"], key_weighted_decay=kwd)
        torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(bank, bank_ref, rtol=1e-5, atol=1e-6)


def test_bad_calls_are_deltabench_one_line_errors() -> None:
    x = ref.make_inputs(1, 4, 1, 8, 4, 2, 2, seed=0)
    x["k_idx"][0, 1, 0, 1] = x["k_idx"][0, 1, 0, 0]
    with pytest.raises(ValueError, match="repeats write slot"):
        adapter.sdm_package_chunk(**x)
    with pytest.raises(ValueError, match=r"k must be in 1\.\.256"):
        adapter.pk_topk_sdm_package(torch.zeros(2, 8), (4, 4), 300)
    with pytest.raises(ValueError, match="address 16 slots, not S=8"):
        adapter.pk_topk_sdm_package(torch.zeros(2, 8), (4, 4), 3, num_slots=8)


def test_constraints_state_their_reasons(stand_in: None) -> None:
    impl = registry.get_impl("sdm", "sdm_pkg_chunk")
    base = Case("sdm", **{**SHAPE, "S": 512}, dtype="bf16", mode="fwd+bwd", device="cuda")
    assert adapter._package_case(base) is None
    assert "at most 256 write and read slots" in adapter._package_case(base.replace(W=300, R=3))
    assert "restores the bank in place" in adapter._package_case(base.replace(mode="bwd"))
    assert "int32" in adapter._package_case(base.replace(B=1, H=2, S=2**30))
    assert impl.check_case(base.replace(device="cpu")) == "runs on cuda, not cpu"
    assert impl.check_case(base.replace(dtype="fp16")) == "supports fp32, bf16, not fp16"


def test_a_package_that_does_not_import_is_the_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _install(tmp_path, {"__init__.py": "", "memory_ops.py": "import a_module_that_is_not_there\n"})
    _forget_package()
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        case = Case("sdm", **SHAPE, dtype="bf16", mode="fwd", device="cuda")
        why = adapter._package_case(case)
        assert why == (
            "sparse_delta_memory does not import: ModuleNotFoundError: No module named 'a_module_that_is_not_there'"
        )
    finally:
        _forget_package()


# ------------------------------------------------------------------------------------------------ the real package


@pytest.fixture(scope="module")
def real_package(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str | None]:
    """The published wheel unpacked on ``sys.path`` (a pure-Python wheel: unpacking is installing); yields why it
    does not import here, or None. Skips when no wheel is found."""
    if not WHEEL.is_file():
        pytest.skip(f"no sparse-delta-memory wheel at {WHEEL} (set DELTABENCH_SDM_WHEEL)")
    site = tmp_path_factory.mktemp("sdm-site")
    with zipfile.ZipFile(WHEEL) as whl:
        whl.extractall(site)
    _forget_package()
    sys.path.insert(0, str(site))
    try:
        yield adapter.import_failure()
    finally:
        sys.path.remove(str(site))
        _forget_package()


def test_the_real_package_is_found_and_its_import_decides(real_package: str | None) -> None:
    impl = registry.get_impl("sdm", "sdm_pkg_chunk")
    assert impl.missing_requirement() is None  # find_spec sees the unpacked package
    case = Case("sdm", **SHAPE, dtype="bf16", mode="fwd", device="cuda")
    assert adapter._package_case(case) == real_package
    if real_package is not None:
        assert real_package.startswith("sparse_delta_memory does not import: ")


def _needs_cuda_and_package(real_package: str | None) -> None:
    if not torch.cuda.is_available():
        pytest.skip("sparse-delta-memory runs on CUDA only (it has no CPU path)")
    if real_package is not None:
        pytest.skip(real_package)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_the_real_package_passes_the_gate_on_cuda(real_package: str | None, dtype: str) -> None:
    _needs_cuda_and_package(real_package)
    case = Case("sdm", **SHAPE, dtype=dtype, mode="fwd+bwd", device="cuda")
    report = verify_case(registry.get_impl("sdm", "sdm_pkg_chunk"), case, seeds=1, extra_seed=False)
    assert report.passed, [f"{r.check} {r.regime} {r.detail}" for r in report.failures]


def test_the_real_decode_and_top_k_match_deltabench_on_cuda(real_package: str | None) -> None:
    _needs_cuda_and_package(real_package)
    x = ref.make_inputs(2, 1, 3, 64, 16, 4, 4, seed=1, initial_bank=True, device="cuda")
    args = [x[n][:, 0] for n in ("k_idx", "k_val", "q_idx", "q_val", "v", "g", "beta")]
    y, bank = adapter.sdm_decode_step_package(*args, x["initial_bank"])
    y_ref, bank_ref = sdm_decode_step(*args, x["initial_bank"])
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(bank, bank_ref, rtol=1e-5, atol=1e-6)
    # ties on purpose: scores on a coarse grid, so the tie rule decides the selection
    raw = (torch.randint(-4, 5, (64, 16), generator=torch.Generator().manual_seed(2)) / 4).cuda()
    val, idx = adapter.pk_topk_sdm_package(raw, (8, 8), 10)
    val_ref, idx_ref = pk_topk_torch(raw, (8, 8), 10)
    assert torch.equal(idx, idx_ref) and torch.equal(val.float(), val_ref.float())
