#!/usr/bin/env bash
# The GPU part of the `run --repeat auto --base-ref` calibration on one H200 (issue 39: >= 100 same-code ordered pairs,
# >= 20 pairs with a planted 5% slowdown). One device call, carry [".whl/base"]:
#
#   bash benchmarks/gpu/gate_auto_record.sh      # $OUT/runs.tgz: the run documents, record.json, collect.log
#
# It records SAME same-code and PLANTED planted (5%, gdn/triton_chunk's forward, benchmarks/cpu/planted_slowdown.py's
# torch.cuda._sleep calibrated per shape) runs of benchmarks/gpu/gate-auto-h200.toml, REPEAT fresh processes a run,
# CHUNK runs an invocation (`deltabench run --repeat CHUNK*REPEAT`, then cut into runs of REPEAT: one process tree,
# one correctness gate and one document for CHUNK runs), and starts no invocation that would end past DEADLINE_S.
# REPEAT=6 is the rule's first look for one job (looks 6, 12, 20): a pair still UNKNOWN there is counted
# `truncated` by the replay, so the replay itself says whether the H200 needed a later look. The replay runs off the
# GPU (it grades stored documents; seconds): unpack runs.tgz, then
#
#   python benchmarks/gate_auto_calibration.py replay --dir runs --planted-impl gdn/triton_chunk \
#       --threshold 0.05 --threshold 0.02 --note "one H200, ..." \
#       --out benchmarks/results/gate-calibration/gate-auto-h200.json
#
# and ingest runs/blocks/*.json (the invocations' own documents) into the results store (benchmarks/results/README.md).
# Predicted wall time (benchmarks/NOTES.md section 3): install + 4 invocations x ~15-20 s + 78 processes x 4-6 s,
# about 6-9 minutes.
set -uo pipefail
OUT=${OUT:-/tmp/out}
SAME=${SAME:-11}
PLANTED=${PLANTED:-2}
REPEAT=${REPEAT:-6}
CHUNK=${CHUNK:-4}
DEADLINE_S=${DEADLINE_S:-480}
# Outside $OUT, so that a call cut by DEADLINE_S leaves its whole invocations on the (warm) machine: the same command
# again records only the rest.
RUNS=${RUNS:-/tmp/gate-auto-runs}
mkdir -p "$RUNS" "$OUT"
export PYTHONUNBUFFERED=1
export DELTABENCH_GIT_COMMIT=${DELTABENCH_GIT_COMMIT:-$(cat .deltabench-commit 2>/dev/null || true)}
t0=$SECONDS
bash benchmarks/gpu/install.sh >"$OUT/install.log" 2>&1 || { tail -40 "$OUT/install.log"; exit 1; }
echo "install: $((SECONDS - t0)) s"
export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv >"$OUT/gpu.txt"; cat "$OUT/gpu.txt"
timeout $((DEADLINE_S + 120)) python3 benchmarks/gate_auto_calibration.py record \
    --suite benchmarks/gpu/gate-auto-h200.toml --same "$SAME" --planted "$PLANTED" --fraction 0.05 \
    --repeat "$REPEAT" --chunk "$CHUNK" --planted-impl gdn/triton_chunk --dir "$RUNS" --deadline-s "$DEADLINE_S"
cp "$RUNS/record.json" "$RUNS/blocks/collect.log" "$OUT/" 2>/dev/null
tar czf "$OUT/runs.tgz" -C "$(dirname "$RUNS")" --transform "s,^$(basename "$RUNS"),runs," "$(basename "$RUNS")"
echo "total: $((SECONDS - t0)) s"
