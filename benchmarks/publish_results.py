"""Write docs/results.md: the curated result tables, each one stored run as ``deltabench results`` prints it.

Every number on the page comes from a result document in the repository's store (benchmarks/results/store.sqlite,
see benchmarks/results/README.md), through the command printed above its table::

    python benchmarks/publish_results.py            # rewrite docs/results.md from the store
    python benchmarks/publish_results.py --check    # exit 1 when docs/results.md is not what the store gives
    python benchmarks/publish_results.py --unpack   # store.sqlite.xz -> store.sqlite, to query or ingest into
    python benchmarks/publish_results.py --pack     # store.sqlite -> store.sqlite.xz (compacted), to commit

The repository tracks the store xz-compressed (``store.sqlite.xz``, about a tenth of the database's size: every
checkout, and every GPU call that carries one, moves it); ``store.sqlite`` beside it is the git-ignored working
copy, unpacked from it whenever it is missing or older.

A table is one run: ``deltabench results --run RUN --format markdown`` renders one stored run whole (its
environment, then a table per op); the ``--op``/``--impl``/``--machine`` filters only narrow csv and parquet
exports, so a table is chosen by choosing its run, in :data:`TABLES` below. To publish a new run, ingest its
document into the store, put its run id in :data:`TABLES` (in place of the run it supersedes, or as a new
entry), run this script and commit the store, the script and the page together.

The command's markdown is kept as printed, except that its headings move down one level (the page has its own
``#`` and ``##``) and ``<`` in its lines is written ``&lt;`` (a failure reason must not read as HTML).
"""

from __future__ import annotations

import argparse
import difflib
import lzma
import shutil
import sqlite3
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STORE = "benchmarks/results/store.sqlite"
PACKED = ROOT / "benchmarks" / "results" / "store.sqlite.xz"
DB = f"sqlite:///{STORE}"  # relative to the repository root, where the commands run
PAGE = ROOT / "docs" / "results.md"
THIS = "python benchmarks/publish_results.py"


@dataclass(frozen=True)
class Table:
    title: str
    run_id: str
    about: str


# The curated tables, in page order. Each caption says what the run compares; the run's own lines say where and
# with what it ran. Runs cut short say so in their environment lines ("incomplete: ...").
TABLES: tuple[Table, ...] = (
    Table(
        "The train suite on the H200",
        "25a099ca454c457bb09ced0240b000d1",
        "Gated DeltaNet at the train shapes, fwd and fwd+bwd, bf16, every impl in one run: deltabench's Triton "
        "kernels (triton_chunk, triton_chunk_split, triton_recurrent) beside FLA (fla_chunk, fla_recurrent), "
        "FlashQLA, opengdn and deltabench's PyTorch and JAX impls, every timing under the integrity defences "
        "(docs/guide/integrity.md): each ok job's integrity records passed, none flagged. The run reached its "
        "600 s cap before jax_chunk's jobs at three shapes; opengdn's kernels fail the gate at K = 128 in bf16 "
        "(as in the earlier run 40c2995932a3, in the index below).",
    ),
    Table(
        "FlashQLA comparison on the H200 (warm caches)",
        "878cb690ae20416f985bc692f0ffab68",
        "The 12-job comparison of benchmarks/gpu/flashqla-h200.toml (fla_chunk, triton_chunk, flash_qla at two "
        "shapes, fwd and fwd+bwd), on the caches that the same suite's run from empty caches had just filled "
        "(run 3a0e70ff3ade, in the index below).",
    ),
    Table(
        "Gated DeltaNet-2 on the H200: every impl",
        "b0267fdec32443d8a2e80d1200c0e03b",
        "The gdn2-gpu suite with FLA's chunk kernel as the baseline, beside deltabench's PyTorch, JAX and Pallas "
        "impls. The run was cut before its end: the suite's jobs it does not list did not run.",
    ),
    Table(
        "Gated DeltaNet-2 on the H200: the Pallas GPU kernels",
        "fa1ced3b79e042268ca363d4251f4e8b",
        "The newest complete gdn2-gpu run: the Pallas GPU kernels in their default tiling. FLA was not installed "
        "in that session, so its jobs are unsupported and there is no speedup column.",
    ),
    Table(
        "Decode on the H200",
        "ec419e5cb5704d389a116e03dca6b0bc",
        "The decode-h200 suite at B 1, 64, 512 x T 1, 4, 8 (gdn; gdn2 and kda at T 1, 4), 16 heads of 128, bf16 "
        "inputs, fp32 state: deltabench's triton_decode (in place) and triton_recurrent beside FLA's fused "
        "recurrent kernel (the baseline), FlashInfer's decode and multi-token kernels and FlashQLA's chunk kernel "
        "stepping the tokens, each step timed in CUDA-graph replays over inputs rotated past L2, all 84 gates "
        "passed. Each timed job also records its kernels' CUPTI sum (integrity:timer_agreement, in the JSON "
        "and the dashboard): one-kernel steps agree with the graph time within 0.5 us or 3%, "
        "except triton_decode at B512 T8 and triton_recurrent at B512 T4, whose traced kernels ran 6-15% longer "
        "than the timed replays before them: those jobs ran at the GPU's power cap (694 W, SM clock 1620-1710 "
        "MHz, their hardware:throttle records); "
        "steps of several kernels (FlashInfer's adapters, the torch references) differ by their launch gaps. "
        "triton_decode's state traffic reaches 89-97% of the copy ceiling at T 1, 83-92% at T 4, 52-63% at T 8.",
    ),
    Table(
        "A model's training step on the H200",
        "b0a8188e6e44462a842f02c9c4ca341b",
        "The e2e-h200 suite: lm_step, a small LM's whole training step (embedding, L blocks of a GDN mixer and an "
        "MLP, cross-entropy, backward, AdamW) at 4 layers of model dim 1024 and 8 of 2048, 4096 tokens, with FLA's "
        "chunked GDN (the baseline) or deltabench's Triton kernels as the mixer, bf16 mixer and float32 rest "
        "(docs/ops/lm-step.md). Every job's gate passed. The mixer is 2-4% of the step at these sizes, so the "
        "three mixers' steps are within 1% of each other.",
    ),
    Table(
        "Packed sequences on the H200",
        "c3ec4623a85a44279c01f782f10208b1",
        "The varlen-h200 suite: 32768 tokens at 16 heads of 128, packed as 19 sequences of lognormal lengths "
        "(mean 2048), beside the same tokens as one dense row and as 16 rows of 2048; every ok job gated. The run "
        "reached its 600 s cap before its last job (kda torch_chunk fwd+bwd); FlashQLA was not installed in that "
        "session. deltabench's packed Triton GDN kernels (their walks a program per sequence and head) are behind "
        "FLA's varlen path, 2.68 / 6.33 ms fwd / fwd+bwd against 0.975 / 3.91, and behind their own dense path at "
        "the same tokens (1.32 / 4.69 ms). GDN-2 and KDA run packed now (FLA's chunk kernels and the PyTorch "
        "references); the earlier run, 455bc5a5a5e3 in the index below, ran out of memory there.",
    ),
    Table(
        "Sparse Delta Memory on the H200",
        "6b3dcd1ad56a4ee399e25d4b09ac0035",
        "The sdm-gpu suite, its three parts of one session merged with benchmarks/merge_runs.py: deltabench's "
        "Triton kernels for sdm at the dense limit (D = R = S = W = 128, B1 x 8K) beside its Gated DeltaNet "
        "kernels at the same tokens, sdm's triton_chunk fwd+bwd at the flagship B1 x 8K, and fwd and fwd+bwd at "
        "the flagship B1 x 32K, every timing under the integrity defences (docs/guide/integrity.md): each ok "
        "job's integrity records passed (77 in 7 jobs), none flagged. The two gdn fwd+bwd jobs ended incorrect "
        "on one gate record, grad:beta rel_fro 9.63e-3 against the bf16 bound 9.0e-3 (seed 0, regime typical, "
        "initial state), at the bf16 bound's margin: FLA's chunk kernel measures 9.55e-3 on the same record on "
        "the same H200. The suite's sdm baseline, torch_chunk, was not in these "
        "parts, so the sdm rows have no speedup. The flagship 8K forward and SDM 2.0.0's own CUDA op "
        "(sdm_pkg_chunk) are in run 6f47b8ff74b8 (suite sdm-h200-pkg), and the suite's earlier run, before the "
        "integrity defences, with gdn's fwd+bwd timed, is b4ba5c16b279; both are in the index below.",
    ),
    Table(
        "Sparse Delta Memory: the PyTorch reference against Triton at 8K",
        "c4b852301ce5441194073c3f627692b3",
        "The sdm-h200-short suite: torch_chunk and triton_chunk at the flagship 8K and the dense limit. Several "
        "jobs ran out of memory or failed the determinism gate, as their status says.",
    ),
    Table(
        "Sparse Delta Memory: the dense limit",
        "182d6f0d6afb4c5f9320e4e278da111f",
        "The sdm-h200-dense suite: triton_chunk at the dense limit (D = R = S = W = 128, 8K tokens), with Gated "
        "DeltaNet at the same length.",
    ),
    Table(
        "Sparse Delta Memory: 32K tokens, fwd+bwd",
        "829acf0143594e3aadcdb709edc28db5",
        "The sdm-h200-32k suite: the flagship shape at B1 x 32K, Triton, the peak-memory target.",
    ),
    Table(
        "Sparse Delta Memory: SDM 2.0.0's own CUDA op",
        "5c5695609f1f4ceba5101edbcf7c6a7b",
        "The sdm-h200-pkg suite: sparse-delta-memory 2.0.0's package (impl sdm_pkg_chunk) at the flagship 8K.",
    ),
    Table(
        "The smoke suite on a CPU",
        "7e0edc1f03c243abb7ad6021a9d6b6fb",
        "`deltabench run --suite smoke` on a 2-core CPU machine (AMD EPYC) from empty caches: every built-in op "
        "(gdn, gdn2, kda) with the PyTorch and JAX impls. CPU timings are host timings, for the harness, not the "
        "kernels.",
    ),
)


def deltabench() -> str:
    """The deltabench command of this interpreter's environment, else the one on PATH."""
    beside = Path(sys.executable).with_name("deltabench")
    found = str(beside) if beside.exists() else shutil.which("deltabench")
    if not found:
        sys.exit("publish_results.py: no deltabench command (pip install -e '.[dev]')")
    return found


def run_markdown(run_id: str) -> str:
    """`deltabench results --run RUN --format markdown` on the store, as printed."""
    cmd = [deltabench(), "results", "--db", DB, "--run", run_id, "--format", "markdown"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"publish_results.py: {' '.join(cmd[1:])} failed:\n{done.stderr.strip()}")
    return done.stdout


def command(run_id: str) -> str:
    return f"deltabench results --db {DB} --run {run_id} --format markdown"


def on_page(markdown: str) -> list[str]:
    """The command's markdown with its headings one level down and ``<`` escaped."""
    lines = []
    for line in markdown.rstrip("\n").splitlines():
        if line.startswith("#"):
            line = "#" + line
        lines.append(line.replace("<", "&lt;"))
    return lines


def run_index() -> list[str]:
    """A table of every stored run, newest first: what each ``deltabench results --run`` would show."""
    from deltabench.db import queries
    from deltabench.db.engine import get_engine, session_scope

    with session_scope(get_engine(str(ROOT / STORE), create=False)) as session:
        runs = queries.list_runs(session, limit=100_000)
    lines = [
        "| created (UTC) | run | suite | machine | jobs | ok | complete |",
        "|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        lines.append(
            f"| {run.created_at:%Y-%m-%d %H:%M} | `{run.run_id[:12]}` | {run.suite} | "
            f"{run.machine_kind} ({run.device_name}) | {run.n_results} | {run.status_counts.get('ok', 0)} | "
            f"{'yes' if run.complete else 'no'} |"
        )
    return lines


def page() -> str:
    out = [
        f"_Generated by `{THIS}` from the result store `{STORE}`: do not edit by hand._",
        "",
        "# Results",
        "",
        "Each table is one stored run, printed by the command above it, which anyone with a checkout can run "
        "again (after `pip install -e '.[dev]'` and `python benchmarks/publish_results.py --unpack`, which unpacks the "
        "tracked `store.sqlite.xz`). The tables are the command's own markdown with their headings "
        "one level down. Each run's first lines say where and with what it ran: the machine and GPU, the "
        "software versions, the deltabench commit, the caches it started from and the date.",
        "",
        "The store holds every result document the project's GPU sessions produced, not only the runs shown "
        "here: the index at the end lists them all. It has no kda run on a GPU yet; kda shows in the CPU smoke "
        "table.",
    ]
    for table in TABLES:
        out += ["", f"## {table.title}", "", table.about, "", "```bash", command(table.run_id), "```", ""]
        out += on_page(run_markdown(table.run_id))
    out += [
        "",
        "## Every stored run",
        "",
        f"Newest first; `deltabench results --db {DB} --run RUN` shows any of them (a unique prefix of its id "
        "will do). A run with no jobs is one whose process was cut before its first job ended.",
        "",
        *run_index(),
    ]
    return "\n".join(out) + "\n"


def unpack(force: bool = False) -> Path:
    """The working store, unpacked from the tracked ``store.sqlite.xz`` when missing, older, or when `force`."""
    store = ROOT / STORE
    if force or not store.exists() or store.stat().st_mtime < PACKED.stat().st_mtime:
        tmp = store.with_suffix(".sqlite.part")
        with lzma.open(PACKED) as src, tmp.open("wb") as dst:
            shutil.copyfileobj(src, dst)
        tmp.replace(store)
    return store


def pack() -> Path:
    """Compact the working store and write it, xz-compressed, over the tracked ``store.sqlite.xz``."""
    store = ROOT / STORE
    with sqlite3.connect(store) as conn:
        conn.execute("VACUUM")
    tmp = PACKED.with_suffix(".xz.part")
    with store.open("rb") as src, lzma.open(tmp, "wb", preset=9) as dst:
        shutil.copyfileobj(src, dst)
    tmp.replace(PACKED)
    return PACKED


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the page instead of writing it")
    parser.add_argument("--unpack", action="store_true", help="only unpack store.sqlite.xz into store.sqlite")
    parser.add_argument("--pack", action="store_true", help="only compact store.sqlite into store.sqlite.xz")
    parser.add_argument("--out", type=Path, default=PAGE, help=f"where to write the page (default: {PAGE})")
    args = parser.parse_args(argv)
    if args.pack:
        print(f"wrote {pack().relative_to(ROOT)}")
        return 0
    store = unpack(force=args.unpack)
    if args.unpack:
        print(f"unpacked {store.relative_to(ROOT)}")
        return 0
    text = page()
    if args.check:
        current = args.out.read_text(encoding="utf-8") if args.out.exists() else ""
        if current != text:
            diff = difflib.unified_diff(current.splitlines(), text.splitlines(), str(args.out), "store", lineterm="")
            print("\n".join(list(diff)[:40]))
            print(f"{args.out} is not what the store gives: run {THIS}", file=sys.stderr)
            return 1
        print(f"{args.out}: up to date")
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out} ({len(TABLES)} tables)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
