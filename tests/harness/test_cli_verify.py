"""``deltabench verify`` and ``deltabench list`` end to end: exit codes 0/1/2, the table, JSON, --import."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from deltabench.cli.app import main

TINY = "B=1,T=40,H=1,K=8,V=8"


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """Run the CLI in-process; returns (exit code, stdout, stderr)."""
    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
    out, err = capsys.readouterr()
    return int(exit_info.value.code or 0), out, err


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_verify_passes_and_prints_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(
        capsys, "verify", "--op", "gdn", "--impl", "torch_chunk", "--shape", TINY, "--dtype", "bf16", "--seeds", "2",
        "--device", "cpu", "--regime", "long",
    )  # fmt: skip
    assert code == 0, out
    texts = ("grad:beta", "stream:output", "rel err", "bound", "worst at", "(drawn)", "PASS", "float64 oracle")
    for text in (*texts, "gate time: ", "impl at full shape"):
        assert text in out
    assert "seeds: 0, 1, " in out
    assert "regimes long;" in out  # --regime narrowed the gate to one regime
    assert max(len(line) for line in out.splitlines()) <= 80  # readable in a plain terminal


def test_verify_decode_as_documented(capsys: pytest.CaptureFixture[str]) -> None:
    """The decode gate of docs/guide: a decode-only impl defaults to mode decode; no gradient is checked."""
    code, out, _ = run_cli(
        capsys, "verify", "--op", "gdn", "--impl", "torch_decode", "--mode", "decode",
        "--shape", "B=4,T=2,H=2,K=32,V=32", "--device", "cpu", "--seeds", "1", "--regime", "long",
    )  # fmt: skip
    assert code == 0, out
    assert "PASS" in out and "grad:" not in out and "lengths T=1, T=3, T=8" in out
    assert "gdn (Gated DeltaNet) / torch_decode: B4-T2-H2-K32-V32 bf16 decode" in out.replace("\n", " ")


def test_verify_json_lists_every_record(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(
        capsys, "verify", "--op", "kda", "--impl", "torch_recurrent", "--shape", TINY, "--dtype", "fp32",
        "--seeds", "1", "--mode", "fwd", "--json", "--device", "cpu",
    )  # fmt: skip
    doc = json.loads(out)
    assert code == 0 and doc["passed"] is True
    assert doc["case"]["mode"] == "fwd" and len(doc["seeds"]) == 2 and doc["seeds"][1] == doc["drawn_seed"]
    checks = {r["check"] for r in doc["records"]}
    assert {"output", "final_state", "finite", "streaming:output", "boundary:output", "inputs_unchanged"} <= checks
    assert "determinism" in checks
    # by default every regime runs, and the length sweep covers T at a chunk multiple, one chunk and T = 1
    assert {r["regime"] for r in doc["records"] if r["check"] == "output"} == {"typical", "long", "strong"}
    assert {r["reference"] for r in doc["records"] if r["check"] == "output"} >= {
        f"oracle at B1-T{T}-H1-K8-V8" for T in (128, 64, 1)
    }
    assert any("scale=0.6/sqrt(K)" in r["reference"] for r in doc["records"])
    assert any("q, k not unit-norm" in r["reference"] for r in doc["records"])
    assert not any(c.startswith("grad:") for c in checks)


def test_verify_a_user_file_with_a_bug_exits_1(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    user = tmp_path / "my_impls.py"
    user.write_text(
        textwrap.dedent(
            """
            from deltabench.harness import register_impl, get_impl

            @register_impl("gdn", "cli_test_off_by_scale", backend="torch", devices=("cpu",), dtypes=("fp32",))
            def off_by_scale(q, k, v, g, beta, scale=None, initial_state=None):
                o, s = get_impl("gdn", "torch_chunk")(q, k, v, g, beta, scale=scale, initial_state=initial_state)
                return o * 1.001, s

            @register_impl("gdn", "cli_test_raises", backend="torch", devices=("cpu",), dtypes=("fp32",))
            def raises(q, k, v, g, beta, scale=None, initial_state=None):
                raise ValueError("no kernel for you")
            """
        )
    )
    code, out, _ = run_cli(
        capsys, "verify", "--op", "gdn", "--impl", "cli_test_off_by_scale", "--shape", TINY, "--dtype", "fp32",
        "--seeds", "1", "--import", str(user), "--device", "cpu",
    )  # fmt: skip
    assert code == 1
    assert "FAIL" in out and "output" in out
    code, out, _ = run_cli(
        capsys, "verify", "--op", "gdn", "--impl", "cli_test_raises", "--shape", TINY, "--dtype", "fp32",
        "--import", str(user), "--device", "cpu",
    )  # fmt: skip
    assert code == 1 and "raised ValueError: no kernel for you" in out


BAD_INPUTS = {
    "unknown op": (["--op", "gdx", "--impl", "torch_chunk", "--shape", TINY], "unknown op 'gdx'"),
    "unknown impl": (["--op", "gdn", "--impl", "nope", "--shape", TINY], "unknown impl 'nope'"),
    "malformed shape": (["--op", "gdn", "--impl", "torch_chunk", "--shape", "B2,T=3"], "malformed shape"),
    "missing dims": (["--op", "gdn", "--impl", "torch_chunk", "--shape", "B=2,T=3"], "lacks H, K, V"),
    "bad dtype": (["--op", "gdn", "--impl", "torch_chunk", "--shape", TINY, "--dtype", "fp8"], "unsupported dtype"),
    "bad regime": (["--op", "gdn", "--impl", "torch_chunk", "--shape", TINY, "--regime", "x"], "unknown gate regime"),
    "forward-only impl": (
        ["--op", "gdn", "--impl", "triton_recurrent", "--shape", TINY, "--mode", "fwd+bwd", "--device", "cpu"],
        "forward only",
    ),
    "missing import": (["--op", "gdn", "--impl", "x", "--shape", TINY, "--import", "no/such.py"], "no such file"),
    "missing option": (["--op", "gdn", "--shape", TINY], "--impl"),
    "decode past 8 tokens": (
        ["--op", "gdn", "--impl", "torch_decode", "--shape", "B=1,T=9,H=1,K=8,V=8", "--mode", "decode"],
        "mode decode takes T from 1 to 8",
    ),
    "decode impl at fwd": (
        ["--op", "gdn", "--impl", "torch_decode", "--shape", TINY, "--mode", "fwd", "--device", "cpu"],
        "runs mode decode, not fwd",
    ),
}


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_bad_input_exits_2_with_one_line(capsys: pytest.CaptureFixture[str], name: str) -> None:
    args, message = BAD_INPUTS[name]
    code, out, err = run_cli(capsys, "verify", *args)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("deltabench: error:") and message in lines[0], err
    assert out == ""


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_a_gpu_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(capsys, "verify", "--op", "gdn", "--impl", "torch_chunk", "--shape", TINY,
                           "--device", "cuda")  # fmt: skip
    assert code == 2 and "no CUDA device" in err and len(err.strip().splitlines()) == 1


def test_triton_on_cpu_runs_under_the_interpreter() -> None:
    """In a fresh process without TRITON_INTERPRET: the command sets it before triton is imported."""
    env = {k: v for k, v in __import__("os").environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-m", "deltabench.cli.app", "verify", "--op", "gdn", "--impl", "triton_recurrent",
         "--shape", "B=1,T=20,H=1,K=16,V=16", "--dtype", "fp32", "--seeds", "1", "--device", "cpu"],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASS" in proc.stdout


def test_list_shows_availability_and_full_reasons(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "list", "--device", "cpu")
    assert code == 0
    assert "torch_chunk" in out and "gdn2" in out
    code, out, _ = run_cli(capsys, "list", "--device", "cpu", "--json")
    doc = json.loads(out)
    reasons = [r["reason"] for r in doc["impls"] if not r["available"]]
    _, table, _ = run_cli(capsys, "list", "--device", "cpu")
    flat = " ".join(table.split())
    for reason in reasons:  # each reason is printed whole, not cut off
        assert " ".join(reason.split()) in flat


def test_list_prints_each_ops_own_signature() -> None:
    """Each op's call from its own contract (sdm's inputs and options, a user op's dims), never the delta family's
    ``scale, initial_state -> (o, ...)`` for every op."""
    import os

    example = Path(__file__).resolve().parents[2] / "examples" / "cumdecay_op.py"
    argv = [sys.executable, "-m", "deltabench.cli.app", "list", "--device", "cpu", "--import", str(example)]
    env = {**os.environ, "COLUMNS": "250"}  # one table row a line
    table = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    listed = json.loads(subprocess.run([*argv, "--json"], capture_output=True, text=True, timeout=120).stdout)
    expected = {
        "gdn": "gdn(q, k, v, g, beta, scale, initial_state=None) -> (o, final_state)",
        "sdm": "sdm(k_idx, k_val, q_idx, q_val, v, g, beta, key_weighted_decay, num_slots, initial_bank=None)"
        " -> (y, final_state)",
        "cumdecay": "cumdecay(x, g, reset, initial_state=None) -> (y, final_state)",
    }
    assert table.returncode == 0, table.stderr
    for op, signature in expected.items():
        assert listed["ops"][op]["signature"] == signature
        [row] = [line for line in table.stdout.splitlines() if line.split()[:1] == [op] and " -> " in line]
        assert row.rstrip().endswith(signature), row


@pytest.mark.parametrize("seed", ["99999999999999999999", "-1", str(2**62)])
def test_a_seed_out_of_range_is_bad_input(capsys: pytest.CaptureFixture[str], seed: str) -> None:
    """Exit 2 with one line naming the range, before any kernel runs (an overflowing seed failed the kernel)."""
    code, out, err = run_cli(capsys, "verify", "--op", "gdn", "--impl", "torch_chunk", "--shape", TINY, "--seed", seed)
    assert code == 2 and out == "", out
    assert len(err.strip().splitlines()) == 1 and "out of range" in err and str(2**62 - 1) in err, err


def test_a_piped_table_folds_rather_than_cuts(capsys: pytest.CaptureFixture[str]) -> None:
    """Piped (80 columns), a wide row (a drawn seed of ten digits, a long worst index) folds its index onto the next
    line: no bound, seed or verdict is cut short with an ellipsis."""
    code, out, _ = run_cli(
        capsys, "verify", "--op", "gdn", "--impl", "torch_chunk", "--shape", "B=2,T=400,H=3,K=16,V=16",
        "--seeds", "1", "--seed", "1234567890", "--device", "cpu", "--regime", "typical",
    )  # fmt: skip
    assert code == 0, out
    assert "…" not in out, out
    assert max(len(line) for line in out.splitlines()) <= 80
    rows = [ln for ln in out.splitlines() if ln.strip().startswith(("output ", "grad:")) and len(ln.split()) >= 7]
    assert rows and all(line.rstrip().endswith("pass") for line in rows), rows
    assert all(re.fullmatch(r"\d\.\d\de-\d\d", line.split()[3]) for line in rows), rows  # every bound whole
