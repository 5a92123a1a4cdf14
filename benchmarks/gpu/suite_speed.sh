#!/usr/bin/env bash
# How long a GPU suite takes end to end: the 12-job comparison of flashqla-h200.toml (fla_chunk, triton_chunk,
# flash_qla x 2 shapes x fwd, fwd+bwd), once from cold caches and once warm, wall clock and per-job overhead.
# Targets: cold < 240 s, warm < 120 s, overhead of a compiled kernel <= 5 s per job beyond its timing.
#
# FlashQLA's wheels need two back-to-back calls (README.md here); the measurement is the second:
#   first, here: git rev-parse HEAD > .deltabench-commit
#   call 1, carry [.whl/base, .whl/fla, .whl/opengdn, .gpucache/qla1, .deltabench-commit]:  bash benchmarks/gpu/install.sh && bash benchmarks/gpu/stage_qla.sh
#   call 2, carry [.gpucache/qla2, .deltabench-commit], within 30 s:                             bash benchmarks/gpu/suite_speed.sh
# About 6 minutes if the targets hold; each run is cut at 280 s so that both fit in one call's 10 minutes.
# Then ingest $OUT/speed-cold.json and $OUT/speed-warm.json into the repository's store
# (`deltabench ingest --db sqlite:///benchmarks/results/store.sqlite ...`, benchmarks/results/README.md) and record
# the wall times and $OUT/suite-speed.md's figures (not in the documents) in benchmarks/NOTES.md.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export DELTABENCH_GIT_COMMIT=${DELTABENCH_GIT_COMMIT:-$(cat .deltabench-commit 2>/dev/null || true)}
bash benchmarks/gpu/install.sh >"$OUT/install-speed.log" 2>&1 || { tail -40 "$OUT/install-speed.log"; exit 1; }
tail -6 "$OUT/install-speed.log"
qla=$(bash benchmarks/gpu/stage_qla.sh)
export PYTHONPATH=/tmp/site${qla:+:$qla}

# Every cache this run may fill, empty at the start: the first run is cold, the second warm.
CACHES=/tmp/deltabench-speed-caches
rm -rf "$CACHES"
export TRITON_CACHE_DIR=$CACHES/triton TILELANG_CACHE_DIR=$CACHES/tilelang
export DELTABENCH_JAX_CACHE_DIR=$CACHES/jax DELTABENCH_REFERENCE_CACHE=$CACHES/references

walls=()
for run in cold warm; do
    t0=$(date +%s.%N)
    timeout 280 python3 -m deltabench.cli.app run --suite benchmarks/gpu/flashqla-h200.toml --device cuda \
        --no-db --out "$OUT/speed-$run.json" --format markdown >"$OUT/speed-$run.log" 2>&1
    rc=$?
    wall=$(python3 -c "import time; print(f'{time.time() - $t0:.1f}')")
    walls+=(--wall-s "$wall")
    echo "$run: exit $rc, wall ${wall} s"
done
python3 benchmarks/job_overhead.py "$OUT/speed-cold.json" "$OUT/speed-warm.json" "${walls[@]}" | tee "$OUT/suite-speed.md"
grep -E "^\|" "$OUT/speed-warm.log" | cut -c1-160 | tail -16
