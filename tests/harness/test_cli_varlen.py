"""``--seqlens`` on verify and run, suites' packed shapes, and ``deltabench list``'s varlen column: the CLI side of
packed variable-length batches (cu_seqlens)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from deltabench.cli.app import main
from deltabench.harness.errors import BadInput
from deltabench.harness.suites import load_suite, parse_suite

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SHAPE = "B=1,T=150,H=2,K=16,V=16"
SEQLENS = "17,64,1,68"

USER = '''
import itertools
import torch
from deltabench.harness import register_impl, get_impl

@register_impl("gdn", "cli_test_leak", backend="torch", devices=("cpu",), dtypes=("fp32",), varlen=True)
def leak(q, k, v, g, beta, scale=None, initial_state=None, cu_seqlens=None):
    """The packed row run as one sequence: the state crosses every boundary."""
    h0 = None if initial_state is None else initial_state[:1]
    o, _ = get_impl("gdn", "torch_recurrent")(q, k, v, g, beta, scale=scale, initial_state=h0)
    n = cu_seqlens.numel() - 1
    return o, torch.zeros(n, q.shape[2], q.shape[3], v.shape[3])

@register_impl("gdn", "cli_test_dense", backend="torch", devices=("cpu",), dtypes=("fp32",))
def dense(q, k, v, g, beta, scale=None, initial_state=None):
    return get_impl("gdn", "torch_chunk")(q, k, v, g, beta, scale=scale, initial_state=initial_state)
'''


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
    out, err = capsys.readouterr()
    return int(exit_info.value.code or 0), out, err


def verify(capsys: pytest.CaptureFixture[str], impl: str, *extra: str) -> tuple[int, str, str]:
    return run_cli(
        capsys, "verify", "--op", "gdn", "--impl", impl, "--shape", SHAPE, "--dtype", "fp32", "--seeds", "1",
        "--regime", "long", "--device", "cpu", *extra,
    )  # fmt: skip


def test_verify_packs_the_sequences_and_passes(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = verify(capsys, "torch_chunk", "--seqlens", SEQLENS, "--json")
    assert code == 0
    report = json.loads(out)
    assert report["case"]["seqlens"] == [17, 64, 1, 68] and report["passed"]
    assert any("sequence" in r["detail"] for r in report["records"] if r["check"] == "output")


def test_verify_a_boundary_leaking_impl_exits_1(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    user = tmp_path / "leak.py"
    user.write_text(textwrap.dedent(USER))
    code, out, _ = verify(capsys, "cli_test_leak", "--seqlens", SEQLENS, "--import", str(user))
    assert code == 1 and "FAIL" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--seqlens", "17,64"], "seqlens sum to 81, not T=150"),
        (["--seqlens", "17,x"], "expected positive integers"),
        (["--seqlens", "150", "--shape", "B=2,T=150,H=2,K=16"], "take B=1"),
    ],
)
def test_bad_seqlens_exit_2_with_one_line(capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    code, out, err = verify(capsys, "torch_chunk", *args)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and message in lines[0], err
    assert out == ""


def test_an_impl_without_cu_seqlens_is_refused_with_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    user = tmp_path / "dense.py"
    user.write_text(textwrap.dedent(USER))
    code, _, err = verify(capsys, "cli_test_dense", "--seqlens", SEQLENS, "--import", str(user))
    assert code == 2 and "does not take cu_seqlens" in err


def test_a_suite_shape_takes_lengths_or_a_drawn_distribution() -> None:
    data = {
        "name": "packed",
        "device": "cpu",
        "ops": {
            "gdn": {
                "impls": ["torch_chunk"],
                "shapes": [
                    {"B": 1, "T": 150, "H": 2, "K": 16, "seqlens": [17, 64, 1, 68]},
                    {"B": 1, "T": 150, "H": 2, "K": 16, "seqlens": "lognormal(mean=30, sigma=1.0, total=150, seed=0)"},
                ],
            }
        },
    }
    jobs = parse_suite(data).jobs(device="cpu")
    listed, drawn = (case for case, _ in jobs)
    assert listed.seqlens == (17, 64, 1, 68) and listed.shape_id == "B1-T150-H2-K16-V16-N4"
    assert sum(drawn.seqlens) == 150 and drawn.seqlens_from == "lognormal(mean=30,sigma=1,total=150,seed=0)"
    assert drawn.shape_id.endswith(f"-N{len(drawn.seqlens)}-lognormal(mean=30,sigma=1,total=150,seed=0)")
    bad = {
        **data,
        "ops": {"gdn": {"impls": ["torch_chunk"], "shapes": [{**data["ops"]["gdn"]["shapes"][0], "T": 151}]}},
    }
    with pytest.raises(BadInput, match="sum to 150, not T=151"):
        parse_suite(bad)


def test_the_varlen_cpu_suite_loads_with_packed_shapes() -> None:
    suite = load_suite("varlen-cpu")
    cases = [case for case, _ in suite.jobs(device="cpu")]
    assert cases and all(case.seqlens is not None for case in cases)


def test_run_with_seqlens_packs_the_suite_and_stores_the_lengths(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    suite = tmp_path / "tiny.toml"
    suite.write_text(
        textwrap.dedent(
            f"""
            name = "tiny"
            device = "cpu"
            shapes = ["{SHAPE}", "B=1,T=64,H=2,K=16"]
            dtypes = ["fp32"]
            modes = ["fwd"]
            [timing]
            budget_s = 0.05
            min_reps = 2
            warmup_s = 0.01
            [gate]
            seeds = 1
            extra_seed = false
            regimes = ["long"]
            [ops.gdn]
            impls = ["torch_chunk"]
            """
        )
    )
    out = tmp_path / "doc.json"
    code, _, err = run_cli(
        capsys, "run", "--suite", str(suite), "--seqlens", SEQLENS, "--no-db", "--quiet", "--out", str(out)
    )
    assert code == 0, err
    doc = json.loads(out.read_text())
    (result,) = doc["jobs"]
    assert result["case"]["seqlens"] == [17, 64, 1, 68] and result["status"] == "ok"
    code, _, err = run_cli(capsys, "run", "--suite", str(suite), "--seqlens", "17,64", "--no-db", "--quiet")
    assert code == 2 and "has no shape B=1,T=81" in err


def test_list_says_which_impls_take_packed_sequences(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "list", "--json", "--device", "cpu")
    varlen = {(r["op"], r["impl"]): r["varlen"] for r in json.loads(out)["impls"]}
    assert code == 0
    assert varlen[("gdn", "triton_chunk")] and varlen[("gdn", "torch_chunk")] and varlen[("kda", "torch_chunk")]
    assert not varlen[("gdn", "jax_chunk")] and not varlen[("sdm", "torch_chunk")]
    code, out, _ = run_cli(capsys, "list", "--device", "cpu")
    assert "varlen" in out
