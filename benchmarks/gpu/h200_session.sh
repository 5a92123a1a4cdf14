#!/usr/bin/env bash
# The H200 session in two back-to-back device calls (FlashQLA's wheels need two: see README.md here).
#
#   first, here: git rev-parse HEAD > .deltabench-commit   (git-ignored: name it in each call's carry)
#   call 1, carry [.whl/base, .whl/fla, .whl/opengdn, .whl/qla1]:  bash benchmarks/gpu/h200_session.sh 1
#   call 2, carry [.whl/qla2], within 30 s:                          bash benchmarks/gpu/h200_session.sh 2
#   or one call, carry [.whl/base]:                                  bash benchmarks/gpu/h200_session.sh split
#
# Phase 1: install, environment, the gate for triton_chunk / triton_recurrent at awkward shapes on the GPU,
# measurement quality. Phase 2: the `train` suite (every target shape of the Triton issue) side by side with
# FLA's Triton path into $OUT/train-h200.json (job by job: a run cut short keeps its jobs), then FlashQLA
# beside FLA and triton_chunk (flashqla-h200.toml) into $OUT/flashqla-h200.json.
# Phase split (one call, no FLA or FlashQLA needed): lever 1 of benchmarks/NOTES.md alone: the gate matrix for
# triton_chunk_split in bf16, its stages timed one by one (split_stages.py), and split-h200.toml (triton_chunk_split
# beside triton_chunk at the two target shapes, gated, fwd and fwd+bwd) into $OUT/split-h200.json. The stage
# timings come first: they compile the kernels at the suite's H (a constexpr) into Triton's disk cache.
set -uo pipefail
phase=${1:?phase 1, 2 or split}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 FLA_FLASH_QLA=0
# the device copy has no .git: pass the commit along (run `DELTABENCH_GIT_COMMIT=$(git rev-parse HEAD)` here)
export DELTABENCH_GIT_COMMIT=${DELTABENCH_GIT_COMMIT:-$(cat .deltabench-commit 2>/dev/null || true)}
bash benchmarks/gpu/install.sh >"$OUT/install-$phase.log" 2>&1 || { tail -40 "$OUT/install-$phase.log"; exit 1; }
tail -12 "$OUT/install-$phase.log"
export PYTHONPATH=/tmp/site
db() { python3 -m deltabench.harness.cli "$@"; }
# Autotuning results of earlier sessions (benchmarks/h200/fla-autotune, tracked) skip FLA's cold autotune; this
# call's come back under $OUT/autotune for the next (autotune_cache.sh).
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton-cache}
bash benchmarks/gpu/autotune_cache.sh restore benchmarks/h200/fla-autotune
trap 'bash benchmarks/gpu/autotune_cache.sh save "$OUT/autotune"' EXIT

if [[ $phase == 1 ]]; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv >"$OUT/gpu.txt"
    cat "$OUT/gpu.txt"
    db list --device cuda >"$OUT/list.txt" 2>&1; tail -25 "$OUT/list.txt"
    timeout 130 python3 benchmarks/gpu/verify_matrix.py --device cuda >"$OUT/verify-gpu.log" 2>&1
    echo "verify exit=$?"; grep -v "^PASS" "$OUT/verify-gpu.log" | tail -25; grep -c "^PASS" "$OUT/verify-gpu.log"
    timeout 150 python3 benchmarks/gpu/verify_matrix.py --device cuda --impl triton_chunk_split \
        >"$OUT/verify-split-gpu.log" 2>&1
    echo "verify split exit=$?"; grep -v "^PASS" "$OUT/verify-split-gpu.log" | tail -25
    grep -c "^PASS" "$OUT/verify-split-gpu.log"
    timeout 150 python3 benchmarks/measurement_quality.py --impl fla_chunk --impl triton_chunk --mode fwd+bwd \
        --repeats 5 --budget-s 1.0 >"$OUT/mq.log" 2>&1
    tail -15 "$OUT/mq.log"
elif [[ $phase == 2 ]]; then
    timeout 330 python3 -m deltabench.harness.cli run --suite train --device cuda --no-db --timeout 120 \
        --impl fla_chunk --impl triton_chunk --impl triton_chunk_split --impl fla_recurrent --impl triton_recurrent \
        --out "$OUT/train-h200.json" --format markdown >"$OUT/train-run.log" 2>&1
    echo "train exit=$?"
    grep -E "^\|" "$OUT/train-run.log" | cut -c1-160 | tail -45
    timeout 200 python3 -m deltabench.harness.cli run --suite benchmarks/gpu/flashqla-h200.toml --device cuda --no-db \
        --out "$OUT/flashqla-h200.json" --format markdown >"$OUT/flashqla-run.log" 2>&1
    echo "flashqla exit=$?"
    grep -E "^\|" "$OUT/flashqla-run.log" | cut -c1-160 | tail -16
elif [[ $phase == split ]]; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv >"$OUT/gpu.txt"
    cat "$OUT/gpu.txt"
    timeout 170 python3 benchmarks/gpu/verify_matrix.py --device cuda --impl triton_chunk_split --dtype bf16 \
        >"$OUT/verify-split-gpu.log" 2>&1
    echo "verify split exit=$?"; cat "$OUT/verify-split-gpu.log" | cut -c1-160 | tail -14
    timeout 110 python3 benchmarks/gpu/split_stages.py --out "$OUT/split-stages.json" >"$OUT/split-stages.log" 2>&1
    echo "stages exit=$?"; tail -16 "$OUT/split-stages.log"
    timeout 260 python3 -m deltabench.harness.cli run --suite benchmarks/gpu/split-h200.toml --device cuda --no-db \
        --out "$OUT/split-h200.json" --format markdown >"$OUT/split-run.log" 2>&1
    echo "split run exit=$?"
    grep -E "^\|" "$OUT/split-run.log" | cut -c1-160 | tail -14
else
    echo "unknown phase $phase: use 1, 2 or split"; exit 2
fi
