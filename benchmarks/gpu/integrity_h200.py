"""The timing's integrity defences on a GPU: no false flag on the shipped impls, every CUDA exploit flagged.

Run on the GPU machine (a script, not a test), after ``benchmarks/gpu/install.sh``::

    python benchmarks/gpu/integrity_h200.py suites [--suite train --suite sdm-gpu] [--shape S ...] [--cost] [--out D]
    python benchmarks/gpu/integrity_h200.py exploits [--shape B=2,T=1024,H=4,K=128,V=128]
    python benchmarks/gpu/integrity_h200.py report DOC.json [DOC.json ...]

``suites`` runs ``deltabench run --suite X --device cuda`` (gated, then timed with every integrity defence) and
prints each job's failed integrity records (a false flag: every job of these suites is a shipped impl) with the
``integrity:cost``, ``kernel_time`` and ``ghost`` notes; with ``--cost`` it runs each suite again with
``[gate] integrity = false`` and prints the two runs' wall times. ``exploits`` runs
``deltabench verify --integrity`` on each impl of benchmarks/gpu/integrity_exploits_cuda.py and on the honest
``triton_chunk``, and prints which defences flagged each, or for one let through whether its time was honest (at
least 70% of the honest kernel's). Exit 1 on a false flag, or an exploit neither flagged nor timed honestly.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
EXPLOITS = HERE / "integrity_exploits_cuda.py"
EXPLOIT_IMPLS = ("cuda_exploit_side_stream", "cuda_exploit_pointer_cache", "cuda_exploit_triton_cache")
NOTES = ("integrity:cost", "integrity:kernel_time", "integrity:ghost")


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "deltabench.cli.app", *args]


def _suite_file(name: str, out: Path, integrity: bool) -> str:
    """The shipped suite `name`, or a copy of it with ``[gate] integrity = false``."""
    if integrity:
        return name
    from deltabench.harness.suites import SUITES_DIR

    text = (SUITES_DIR / f"{name}.toml").read_text()
    text = re.sub(r"^\[gate\]\s*$", "[gate]\nintegrity = false", text, count=1, flags=re.M)
    if "integrity = false" not in text:
        text = re.sub(r"^(\[(?!timing)[^\]]*\])", "[gate]\nintegrity = false\n\n\\1", text, count=1, flags=re.M)
    target = out / f"{name}-no-integrity.toml"
    target.write_text(text)
    return str(target)


def run_suite(name: str, shapes: list[str], out: Path, integrity: bool) -> tuple[float, dict]:
    """One ``deltabench run`` of the suite: its wall seconds and its result document."""
    doc = out / f"{name}{'' if integrity else '-no-integrity'}.json"
    cmd = _cli("run", "--suite", _suite_file(name, out, integrity), "--device", "cuda", "--no-db", "--out", str(doc))
    for s in shapes:
        cmd += ["--shape", s]
    t0 = time.monotonic()
    subprocess.run(cmd, check=False)
    return time.monotonic() - t0, json.loads(doc.read_text()) if doc.exists() else {"jobs": []}


def report_suite(name: str, doc: dict) -> int:
    """Print each job's integrity verdicts; the number of false flags (failed gating integrity records)."""
    flags = 0
    for job in doc["jobs"]:
        case = job["case"]
        dims = ",".join(f"{k}={v}" for k, v in case.items() if isinstance(v, int) and not isinstance(v, bool))
        label = f"{case['op']}/{job['impl']} {case.get('dtype')} {case.get('mode')} {dims}"
        recs = [r for r in job.get("verification", []) if r["check"].startswith("integrity:")]
        bad = [r for r in recs if r.get("gating", True) and not r["passed"]]
        flags += bool(bad)
        notes = "; ".join(f"{r['check'][10:]}: {r['detail'][:100]}" for r in recs if r["check"] in NOTES)
        verdict = "FALSE FLAG" if bad else job["status"]
        print(f"[{name}] {label}: {verdict} ({len(recs)} integrity records) {notes}")
        for r in bad:
            print(f"    {r['check']}: {r['detail']}")
    return flags


def suites(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    flags = 0
    for name in args.suite or ["train", "sdm-gpu"]:
        wall, doc = run_suite(name, args.shape or [], out, integrity=True)
        flags += report_suite(name, doc)
        print(f"[{name}] with the integrity defences: {wall:.0f} s for {len(doc['jobs'])} jobs")
        if args.cost:
            wall_off, doc_off = run_suite(name, args.shape or [], out, integrity=False)
            print(f"[{name}] without them: {wall_off:.0f} s for {len(doc_off['jobs'])} jobs")
    print(f"false flags: {flags}")
    return 1 if flags else 0


def report(args: argparse.Namespace) -> int:
    """The false flags of documents made by other runs (a session's suites, each run once)."""
    flags = 0
    for path in map(Path, args.docs):
        doc = json.loads(path.read_text()) if path.exists() else {"jobs": []}
        flags += report_suite(path.stem, doc)
    print(f"false flags: {flags}")
    return 1 if flags else 0


# An exploit the defences let through is still defended when the time it reports is honest: at least this share of
# the honest kernel's (a side stream's work that the timer's synchronisation waits for is timed, not hidden).
HONEST_SHARE = 0.7


def exploits(args: argparse.Namespace) -> int:
    """Each CUDA exploit flagged or timed honestly (within 30% of the honest kernel), the honest one not flagged."""
    missed, honest_ms = 0, None
    for impl in ("triton_chunk", *EXPLOIT_IMPLS):
        cmd = _cli("verify", "--integrity", "--op", "gdn", "--impl", impl, "--import", str(EXPLOITS), "--json",
                   "--shape", args.shape, "--dtype", "bf16", "--device", "cuda", "--mode", "fwd")  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        try:
            out = json.loads(proc.stdout)
            records = out["records"]
        except (json.JSONDecodeError, KeyError):
            print(f"{impl}: no result (exit {proc.returncode}): {proc.stderr[-800:]}")
            missed += 1
            continue
        failed = [r["check"][10:] for r in records if r.get("gating", True) and not r["passed"]]
        median = out.get("median_ms")
        if impl == "triton_chunk":
            honest_ms, wrong, what = median, bool(failed), ", ".join(failed) or "nothing"
        elif failed:
            wrong, what = False, ", ".join(failed)
        else:  # let through: defended only if its time is the honest kernel's
            honest = median is not None and honest_ms is not None and median >= HONEST_SHARE * honest_ms
            wrong = not honest
            what = f"nothing; timed {'honestly' if honest else 'DISHONESTLY'}: {median} ms against {honest_ms} ms"
        missed += wrong
        print(f"{impl}: flagged by {what}{'  <-- WRONG' if wrong else ''}")
        for r in records:
            if r["check"][10:] in failed or r["check"] in NOTES:
                print(f"    {r['check']}: {r['detail'][:160]}")
    print(f"wrong verdicts: {missed}")
    return 1 if missed else 0


def main() -> int:
    """Parse the arguments and run the part asked for."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="part", required=True)
    s = sub.add_parser("suites")
    s.add_argument("--suite", action="append", help="suites (default: train, sdm-gpu)")
    s.add_argument("--shape", action="append", help="only these shapes of each suite")
    s.add_argument("--cost", action="store_true", help="run each suite again without the defences")
    s.add_argument("--out", default="integrity-h200", help="where the result documents go")
    r = sub.add_parser("report", help="the integrity verdicts of result documents already made")
    r.add_argument("docs", nargs="+", help="result documents (JSON) of runs on the GPU")
    e = sub.add_parser("exploits")
    e.add_argument("--shape", default="B=2,T=1024,H=4,K=128,V=128")
    args = parser.parse_args()
    parts = {"suites": suites, "exploits": exploits, "report": report}
    return parts[args.part](args)


if __name__ == "__main__":
    sys.exit(main())
