"""Calibrate ``deltabench run --repeat auto --base-ref`` and the gate on it: false failures on same-code pairs and
the power to catch a planted slowdown, each pair one interleaved invocation.

Each pair runs the suite from a scratch git repository whose committed ``planted.py`` (a copy of
``benchmarks/cpu/planted_slowdown.py`` with the fraction fixed at 0) is the base side's, and whose working-tree
copy is the head's: fraction 0 for a same-code pair, ``--fraction`` for a planted one (the base side imports the
committed copy, ``runners.interleave``). Pairs alternate (same, planted, same, ...) so both kinds see the same
machine states. Each pair is then gated (``deltabench gate --base OUT.base.json --head OUT.json``) and its exit
code, verdict counts, and the planted impl's rows (outcome, minimum detectable change, repetitions) are kept.

Figures: same-code gates failed (exit 1: the false-failure rate, target <= alpha), ended unknown (exit 3) or same;
planted pairs whose planted jobs (``--planted-impl``, ``--planted-mode``) were all graded regressions (the power),
and the repetitions used. The issue's targets on the H200: >= 100 same-code pairs with false failures <= 2%, and
>= 20 planted 5% pairs caught >= 80%; on the CPU the same figures for 20% steps::

    python benchmarks/gate_auto_calibration.py --suite benchmarks/gpu/gate-calibration-h200.toml --device cuda \\
        --same 100 --planted 20 --fraction 0.05 --planted-impl gdn/triton_chunk --planted-mode fwd \\
        --dir /tmp/auto --out benchmarks/results/gate-calibration/gate-auto-h200.json
    python benchmarks/gate_auto_calibration.py --suite benchmarks/cpu/gate-calibration.toml --device cpu \\
        --same 20 --planted 20 --fraction 0.20 --dir /tmp/auto-cpu --out /tmp/gate-auto-cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

PLANTED_SOURCE = Path(__file__).parent / "cpu" / "planted_slowdown.py"
_FRACTION_LINE = 'FRACTION = float(os.environ.get("DELTABENCH_PLANTED_SLOWDOWN", "0.10"))'


def _git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=calibration", "-c", "user.email=calibration@localhost", *args],
        check=True,
        capture_output=True,
    )


def _planted(fraction: float) -> str:
    """planted_slowdown.py with its fraction fixed (not read from the environment, which both sides share)."""
    text = PLANTED_SOURCE.read_text()
    if _FRACTION_LINE not in text:
        raise SystemExit(f"{PLANTED_SOURCE}: its FRACTION line changed; update {__file__}")
    return text.replace(_FRACTION_LINE, f"FRACTION = {fraction!r}")


def scratch_repo(folder: Path) -> Path:
    """A git repository whose HEAD holds planted.py at fraction 0 (the base side of every pair)."""
    repo = folder / "repo"
    repo.mkdir(parents=True, exist_ok=True)
    _git(repo, "init", "-q")
    (repo / "planted.py").write_text(_planted(0.0))
    _git(repo, "add", "planted.py")
    _git(repo, "commit", "-q", "-m", "base: no slowdown")
    return repo


def run_pair(repo: Path, out: Path, args: argparse.Namespace, fraction: float) -> dict:
    """One interleaved `--repeat auto` invocation with the head's planted.py at `fraction`, then its gate."""
    (repo / "planted.py").write_text(_planted(fraction))
    env = {**os.environ, "DELTABENCH_PLANTED_IMPL": args.planted_impl}
    run = [sys.executable, "-m", "deltabench.cli.app", "run", "--suite", str(Path(args.suite).resolve())]
    run += ["--device", args.device, "--import", "planted.py", "--repeat", "auto", "--max-repeat", str(args.max_repeat)]
    run += ["--base-ref", "HEAD", "--out", str(out), "--no-db", "-q", "--format", "csv"]
    started = time.perf_counter()
    done = subprocess.run(run, cwd=repo, env=env, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    if done.returncode not in (0, 1):
        raise SystemExit(f"run failed (exit {done.returncode}): {done.stderr[-2000:]}")
    cmp_path = out.with_name(out.name.replace(".json", ".cmp.json"))
    base = out.with_name(out.name.replace(".json", ".base.json"))
    gate = [sys.executable, "-m", "deltabench.cli.app", "gate", "--base", str(base), "--head", str(out)]
    code = subprocess.run([*gate, "--json", str(cmp_path)], env=env, capture_output=True, check=False).returncode
    cmp = json.loads(cmp_path.read_text())
    op, impl = args.planted_impl.split("/")
    planted = [
        {
            "shape": r["shape"],
            "mode": r["mode"],
            "outcome": r["outcome"],
            "verdict": r["verdict"],
            "mdc": (r["stats"] or {}).get("min_detectable_change"),
            "change": (r["stats"] or {}).get("change"),
            "repetitions": (r["stats"] or {}).get("head_repetitions"),
        }
        for r in cmp["rows"]
        if r["op"] == op and r["impl"] == impl and (args.planted_mode is None or r["mode"] == args.planted_mode)
    ]
    return {"fraction": fraction, "exit": code, "verdicts": cmp["verdicts"], "planted": planted, "seconds": seconds}


def summarize(pairs: list[dict]) -> dict:
    """False failures and unknowns of the same-code pairs, power on the planted ones."""
    same = [p for p in pairs if p["fraction"] == 0.0]
    planted = [p for p in pairs if p["fraction"] > 0.0]
    caught = [p for p in planted if p["planted"] and all(r["outcome"] == "regression" for r in p["planted"])]
    return {
        "same_pairs": len(same),
        "same_failed": sum(p["exit"] == 1 for p in same),
        "same_unknown": sum(p["exit"] == 3 for p in same),
        "same_passed": sum(p["exit"] == 0 for p in same),
        "false_failure_rate": sum(p["exit"] == 1 for p in same) / len(same) if same else None,
        "planted_pairs": len(planted),
        "planted_caught": len(caught),
        "power": len(caught) / len(planted) if planted else None,
        "repetitions": sorted(r["repetitions"] for p in pairs for r in p["planted"] if r["repetitions"]),
        "seconds": sum(p["seconds"] for p in pairs),
    }


def main(argv: list[str] | None = None) -> int:
    """Run the pairs, print and write the summary."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--suite", required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--same", type=int, default=20, help="same-code pairs")
    ap.add_argument("--planted", type=int, default=20, help="planted pairs")
    ap.add_argument("--fraction", type=float, default=0.20, help="the planted slowdown, e.g. 0.05")
    ap.add_argument("--max-repeat", type=int, default=20)
    ap.add_argument("--planted-impl", default="gdn/torch_chunk")
    ap.add_argument("--planted-mode", default="fwd", help="the planted jobs counted (the busy-wait follows fwd)")
    ap.add_argument("--dir", type=Path, required=True)
    ap.add_argument("--out", type=Path, help="write the pairs and the summary (JSON) here")
    args = ap.parse_args(argv)
    repo = scratch_repo(args.dir)
    same_i, planted_i = iter(range(args.same)), iter(range(args.planted))
    pairs = []
    for _ in range(max(args.same, args.planted)):
        for kind, it, fraction in (("same", same_i, 0.0), ("planted", planted_i, args.fraction)):
            n = next(it, None)
            if n is None:
                continue
            pair = run_pair(repo, args.dir / f"{kind}-{n:03d}.json", args, fraction)
            pairs.append(pair)
            print(f"{kind} {n}: exit {pair['exit']} {pair['verdicts']} {pair['planted']}", flush=True)
            write(args, pairs)  # after every pair: a session cut short keeps the pairs it ended
    print(json.dumps(summarize(pairs), indent=1))
    return 0


def write(args: argparse.Namespace, pairs: list[dict]) -> None:
    """The pairs so far and their summary, as JSON at ``--out`` (nothing without it)."""
    if args.out is not None:
        doc = {"args": {k: str(v) for k, v in vars(args).items()}, "summary": summarize(pairs), "pairs": pairs}
        args.out.write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    sys.exit(main())
