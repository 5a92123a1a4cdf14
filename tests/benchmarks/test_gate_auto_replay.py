"""benchmarks/gate_auto_calibration.py replay: every ordered same-code pair and every (same, planted) pair of stored
runs replayed through ``run --repeat auto``'s rule, with the figures the H200 calibration publishes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from deltabench.harness.documents_io import load_documents
from deltabench.runners.timing import merge_repetitions, summarize

ROOT = Path(__file__).parents[2]
SCRIPT = ROOT / "benchmarks" / "gate_auto_calibration.py"
REAL = ROOT / "benchmarks" / "results" / "fixtures" / "train-h200.json"  # a run the H200 made: its first job


def _write_runs(folder: Path, kind: str, n: int, step: float, seed: int) -> None:
    """`n` runs of the fixture's first job (gdn fla_chunk fwd), 6 repetitions each, processes 0.2% apart around a
    level `step` times the job's median, as ``record`` leaves them (``<kind>_<i>.json``)."""
    (doc,) = load_documents(REAL)
    job = doc.jobs[0]
    rng = np.random.default_rng(seed)
    for i in range(n):
        levels = step * job.timing.median_ms * np.exp(rng.normal(0.0, 0.002, 6))
        per = [summarize((lv * np.exp(rng.normal(0.005, 0.002, 40))).tolist(), clock="cuda_events") for lv in levels]
        run = doc.model_copy(
            update={
                "run_id": f"{kind[0]}{seed:07d}{i:024d}",
                "jobs": [job.model_copy(update={"timing": merge_repetitions(per)})],
                "meta": {},
            }
        )
        (folder / f"{kind}_{i:03d}.json").write_text(run.to_json())


def test_replay_counts_every_ordered_pair_and_catches_the_planted_step(tmp_path: Path) -> None:
    _write_runs(tmp_path, "same", 4, 1.0, seed=1)
    _write_runs(tmp_path, "planted", 2, 1.08, seed=2)
    out = tmp_path / "replay.json"
    cmd = [sys.executable, str(SCRIPT), "replay", "--dir", str(tmp_path), "--planted-impl", "gdn/fla_chunk"]
    done = subprocess.run([*cmd, "--out", str(out)], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    (fig,) = json.loads(out.read_text())["figures"]
    assert fig["distinct_runs"] == {"same": 4, "planted": 2}
    assert (fig["same_pairs"], fig["same_failed"], fig["same_truncated"]) == (12, 0, 0)  # 4 x 3 ordered pairs, SAME
    assert (fig["planted_pairs"], fig["planted_caught"], fig["power"]) == (8, 8, 1.0)
    assert fig["repetitions_same"] == [6] * 12  # the first look decided every pair
    assert fig["false_failure_ci95_bootstrap_over_runs"] == [0.0, 0.0]
    assert 0.0 < fig["false_failure_upper95_disjoint_pairs"] < 1.0  # 2 independent pairs bound little
