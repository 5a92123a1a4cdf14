"""A base and a head run in one invocation, interleaved job by job (``deltabench run --base-ref REF``).

Why: on a shared machine a worker process sits in a fast or a slow state for its whole life, and the machine's load
moves between two runs made minutes apart, so a head run compared with a base run made at another time fails
same-code gates that no within-run spread can explain (benchmarks/NOTES.md, "run --repeat"). Run together, both
sides see the same machine states: repetition r of a job runs on the base code and on the head code back to back,
each in a worker process of its own, so under no change the two sides' repetitions are exchangeable and the gate's
permutation test holds its level (``harness.regression.noise``, "repetitions").

The base side is the code of git ref REF of the repository the command runs in, materialised with ``git archive``
into a temporary folder that is removed at the end. Its workers are ``python -m deltabench.runners.job_main --serve``
with a shim folder first on ``PYTHONPATH`` whose ``deltabench`` package maps each layer (``harness``, ``kernels``,
...; setup.py's ``package_dir``) onto the base tree's folder, so they import the base's deltabench when the
repository is deltabench itself. ``--import`` files inside the repository are imported from the base tree's copy on
the base side (a file the change adds, absent there, is imported on the head side only); modules and files outside it
are imported as they are on both sides. The head side's workers are started the same way, under this process's
code, so that the two sides differ in their code only (not in how their processes were started).

Sequential repetitions (``run --repeat auto``): `looks` names the repetition counts after which `undecided` is
asked which jobs' verdicts are still unknown (``regression.sequential``); only those get the next look's rounds, and
the run ends when none is left or the last look is reached. Both documents record the looks (``meta.sequential``),
so the gate grades them at the level the run stopped on.

Order: round r runs every job of the plan (the suite's impl-by-impl order) on both sides, base first when
``r + j`` is even for the plan's j-th job, head first otherwise (ABBA across rounds and jobs), so neither side always
goes first; each round closes both sides' workers. The correctness gate runs on both sides in round 0. The parent
plans with the head's code (which impls exist and which cases they support); a base job its code cannot run ends
failed in the base document, and the gate calls it not comparable.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from deltabench.harness.document import JobResult, ResultDocument
from deltabench.harness.errors import BadInput
from deltabench.harness.series import JobKey, job_key

from .base import JobSpec
from .session import RunPlan, RunState, execution_order

__all__ = ["LAYERS", "BaseTree", "base_imports", "base_tree", "interleave_order", "run_interleaved"]

# The top-level folders setup.py maps onto ``deltabench.<layer>``.
# A base tree with deltabench's package root, src/deltabench/ (a regular package): src/ goes first on the path.
_SRC_MARKERS = ("src/deltabench/__init__.py", "src/deltabench/runners/job_main.py")
# A base tree from before src/ (its top folders mapped onto deltabench.<folder> by its setup.py): those layers are
# linked under a package of the base side's own.
LAYERS = ("references", "kernels", "harness", "runners", "db", "web")
_MARKERS = ("harness/version.py", "runners/job_main.py")


@dataclasses.dataclass(frozen=True)
class BaseTree:
    """The base side's code: git ref `ref` (commit `commit`) of the repository at `repo`, extracted at `root`."""

    ref: str
    commit: str
    repo: Path
    root: Path
    shim: Path | None  # the folder to put first on PYTHONPATH (None: the repository is not deltabench)

    @property
    def package_root(self) -> Path | None:
        """The base tree's folder of deltabench's layers (src/deltabench, or the root before src/); None when the
        repository is not deltabench."""
        if self.shim is None:
            return None
        return self.shim / "deltabench" if self.shim == self.root / "src" else self.root

    def environment(self) -> dict[str, str]:
        """Variables for the base side's worker processes."""
        if self.shim is None:
            return {}
        path = os.environ.get("PYTHONPATH")
        return {"PYTHONPATH": str(self.shim) + (os.pathsep + path if path else "")}


def _git(repo: Path | None, *args: str) -> str:
    where = ["-C", str(repo)] if repo is not None else []
    out = subprocess.run(["git", *where, *args], capture_output=True, text=True, timeout=60, check=False)
    if out.returncode != 0:
        raise subprocess.CalledProcessError(out.returncode, args, out.stdout, out.stderr)
    return out.stdout.strip()


@contextlib.contextmanager
def base_tree(ref: str, cwd: Path | None = None) -> Iterator[BaseTree]:
    """The code of git ref `ref` of the repository holding `cwd` (default: the current directory), extracted into a
    temporary folder for the context's life.

    Raises:
        BadInput: not inside a git checkout, or `ref` names no commit there (one line, for exit code 2).
    """
    if not ref or ref.startswith("-"):
        raise BadInput(f"--base-ref {ref!r}: not a git ref")
    start = (cwd or Path.cwd()).resolve()
    try:
        repo = Path(_git(start, "rev-parse", "--show-toplevel")).resolve()
    except (OSError, subprocess.SubprocessError):
        raise BadInput(f"--base-ref {ref}: {start} is not inside a git checkout") from None
    try:
        commit = _git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    except (OSError, subprocess.SubprocessError):
        raise BadInput(f"--base-ref {ref!r}: no such commit in {repo}") from None
    tmp = Path(tempfile.mkdtemp(prefix="deltabench-base-"))
    try:
        root = tmp / "tree"
        root.mkdir()
        archive = subprocess.Popen(["git", "-C", str(repo), "archive", commit], stdout=subprocess.PIPE)
        untar = subprocess.run(["tar", "-x", "-C", str(root)], stdin=archive.stdout, capture_output=True, check=False)
        assert archive.stdout is not None
        archive.stdout.close()
        if archive.wait() != 0 or untar.returncode != 0:
            raise BadInput(f"--base-ref {ref}: could not extract commit {commit[:12]} ({untar.stderr.decode()[:200]})")
        shim = None
        if all((root / m).is_file() for m in _SRC_MARKERS):
            shim = root / "src"
        elif all((root / m).is_file() for m in _MARKERS):
            shim = tmp / "shim"
            pkg = shim / "deltabench"
            pkg.mkdir(parents=True)
            # A regular package (not a namespace), so that no other portion of ``deltabench`` on the path (the
            # installed head code) can supply a layer the base tree lacks.
            (pkg / "__init__.py").write_text('"""The base tree\'s deltabench layers (runners/interleave.py)."""\n')
            for layer in LAYERS:
                if (root / layer).is_dir():
                    (pkg / layer).symlink_to(root / layer, target_is_directory=True)
        yield BaseTree(ref=ref, commit=commit, repo=repo, root=root, shim=shim)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def base_imports(imports: list[str], tree: BaseTree) -> list[str]:
    """The base side's ``--import`` specs: a file inside the repository is taken from the base tree (left out when
    the base lacks it: the change adds it); a module, or a file elsewhere, is imported as it is."""
    out = []
    for spec in imports:
        path = Path(spec)
        if not (spec.endswith(".py") or path.is_file()):
            out.append(spec)
            continue
        try:
            rel = path.resolve().relative_to(tree.repo)
        except ValueError:
            out.append(spec)
            continue
        if (tree.root / rel).is_file():
            out.append(str(tree.root / rel))
    return out


def _round(plan: RunPlan, rep: int) -> list[tuple[int, int, bool]]:
    """(round, job index, base first) of round `rep`, in the order its jobs run (module docstring)."""
    return [(rep, index, (rep + j) % 2 == 0) for j, index in enumerate(execution_order(plan))]


def interleave_order(plan: RunPlan) -> list[tuple[int, int, bool]]:
    """(round, job index, base first) in the order the jobs run (module docstring)."""
    return [step for rep in range(plan.repeat) for step in _round(plan, rep)]


def run_interleaved(
    plan: RunPlan,
    tree: BaseTree,
    *,
    out: Path | None = None,
    base_out: Path | None = None,
    on_start: Callable[[JobSpec, str], None] | None = None,
    on_done: Callable[[JobSpec, JobResult, str], None] | None = None,
    on_begin: Callable[[Path, str], None] | None = None,
    python: str | None = None,
    looks: Sequence[int] | None = None,
    undecided: Callable[[ResultDocument, ResultDocument], set[JobKey]] | None = None,
    sequential_meta: dict | None = None,
) -> tuple[ResultDocument, ResultDocument]:
    """Run every job of `plan` on the head code (this process's) and on the base code of `tree`, interleaved;
    return (head document, base document), each saved job by job to `out` / `base_out`. The callbacks are told the
    side (``"head"`` or ``"base"``) too. With `looks` (increasing repetition counts, the last at most
    ``plan.repeat``) and `undecided` ((head, base) documents so far -> keys of the jobs still unknown), jobs stop
    repeating once decided (module docstring); `sequential_meta` is recorded in both documents' ``meta.sequential``."""
    from .environment import collect_environment, kernel_hash
    from .isolated import make_runner

    python = python or sys.executable
    head_env = collect_environment(plan.device)
    base_env = head_env.model_copy(
        update={
            "git_commit": tree.commit if tree.shim is not None else head_env.git_commit,
            "git_dirty": False if tree.shim is not None else head_env.git_dirty,
            "kernel_hash": kernel_hash(tree.package_root) if tree.package_root is not None else head_env.kernel_hash,
        }
    )
    head_id, base_id = uuid.uuid4().hex, uuid.uuid4().hex
    common = {"base_ref": tree.ref, "base_commit": tree.commit}

    def begin(side: str) -> Callable[[Path], None] | None:
        return (lambda path: on_begin(path, side)) if on_begin else None

    if looks is not None:
        common["sequential"] = {**(sequential_meta or {}), "schedule": list(looks), "looks": len(looks)}
    head_meta = {**common, "side": "head", "interleaved_with": base_id}
    base_meta = {**common, "side": "base", "interleaved_with": head_id}
    head = RunState(plan, head_env, out, begin("head"), head_meta, run_id=head_id)
    # both sides' gates draw the same extra seed: they check the same inputs
    base = RunState(plan, base_env, base_out, begin("base"), base_meta, run_id=base_id, drawn_seed=head.drawn_seed)
    base_specs = [
        job.model_copy(update={"job_id": uuid.uuid4().hex, "imports": base_imports(job.imports, tree)})
        for job in plan.jobs
    ]
    runners = {
        "head": make_runner(plan.suite.isolation, python=python),
        "base": make_runner(plan.suite.isolation, python=python, env=tree.environment()),
    }
    states = {"head": head, "base": base}
    specs = {"head": plan.jobs, "base": base_specs}
    stages = list(looks) if looks is not None else [plan.repeat]
    if any(b <= a for a, b in itertools.pairwise(stages)) or not 1 <= stages[-1] <= plan.repeat:
        raise ValueError(f"looks must increase up to the plan's {plan.repeat} repetitions, got {stages}")
    active = set(range(len(plan.jobs)))
    try:
        rounds = 0
        for target in stages:
            for rep in range(rounds, target):
                if rep > 0:
                    for runner in runners.values():
                        close = getattr(runner, "close", None)
                        if close is not None:
                            close()  # each round in processes of its own, on both sides
                for _, index, base_first in _round(plan, rep):
                    if index not in active:
                        continue
                    for side in ("base", "head") if base_first else ("head", "base"):
                        start = (lambda job, s=side: on_start(job, s)) if on_start else None
                        done = (lambda job, result, s=side: on_done(job, result, s)) if on_done else None
                        states[side].step(index, specs[side][index], rep, runners[side], start, done)
            rounds = target
            if undecided is None or target == stages[-1]:
                break
            keys = undecided(head.doc, base.doc)
            active = {i for i in active if i in head.finished and job_key(head.finished[i]) in keys}
            if not active:
                break
        if looks is not None:
            for state in states.values():
                state.doc.meta["sequential"] = {**state.doc.meta["sequential"], "rounds": rounds}
    finally:
        for runner in runners.values():
            close = getattr(runner, "close", None)
            if close is not None:
                close()
    return head.finish(), base.finish()


if __name__ == "__main__":  # pragma: no cover
    sys.exit("deltabench.runners.interleave is a library; use `deltabench run --base-ref REF`")
