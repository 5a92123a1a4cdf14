#!/usr/bin/env bash
# One H200 session in three back-to-back device calls (the machine stays warm 30 s after a call; a later call gets a
# bare one). FlashQLA's wheels come in two halves (README.md here) and are staged in their own site folder,
# /tmp/site-qla, which only phase 2 and 3 put on PYTHONPATH: FLA can then run in phase 1 (a half-installed TileLang
# on the path breaks FLA's import).
#
#   here, first: git rev-parse HEAD > .deltabench-commit; mkdir -p .gpucache && mv .whl/qla1 .whl/qla2 .gpucache/
#   call 1, carry [.whl/base, .whl/fla, .whl/opengdn, .gpucache/qla1, .deltabench-commit]:  bash benchmarks/gpu/h200_session.sh 1
#   call 2, carry [.gpucache/qla2, .deltabench-commit], within 30 s:                         bash benchmarks/gpu/h200_session.sh 2
#   call 3, carry [.deltabench-commit], within 30 s:                                         bash benchmarks/gpu/h200_session.sh 3
#
# Phase 1: our Triton GDN beside FLA in one process (benchmarks/gdn_kernels.py: each impl checked against torch_chunk
# in fp32 at every train shape, then timed), the sdm-gpu suite (ours; SDM's own op needs its build: README.md),
# GDN-2's Pallas kernels for a GPU (gdn2_pallas.py). Phase 2: the `train` suite, gated, with FLA, FlashQLA and ours
# (every job's result lands in the document as it ends). Phase 3: the 12-job comparison on the warm caches of phase 2
# (flashqla-h200.toml, with the harness's overhead per job) and the regression gate's calibration (5 + 5 runs).
# A call returns at most 8 files: each phase leaves a summary log and one archive of everything under $OUT.
set -uo pipefail
phase=${1:?phase 1, 2 or 3}
OUT=${OUT:-/tmp/out}
WORK=/tmp/work-$phase
mkdir -p "$OUT" "$WORK"
export PYTHONUNBUFFERED=1 FLA_FLASH_QLA=0
# the device copy has no .git: pass the commit along
export DELTABENCH_GIT_COMMIT=${DELTABENCH_GIT_COMMIT:-$(cat .deltabench-commit 2>/dev/null || true)}
bash benchmarks/gpu/install.sh >"$WORK/install.log" 2>&1 || { tail -40 "$WORK/install.log"; exit 1; }
tail -4 "$WORK/install.log"
QLA_SITE=/tmp/site-qla
for half in qla1 qla2; do
    if [[ -d .gpucache/$half ]]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$QLA_SITE" \
            .gpucache/$half/*.whl && echo "staged $half in $QLA_SITE"
    fi
done
export PYTHONPATH=/tmp/site
[[ $phase == 1 ]] || export PYTHONPATH=/tmp/site:$QLA_SITE
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/triton-cache}
bash benchmarks/gpu/autotune_cache.sh restore benchmarks/h200/fla-autotune
finish() {
    bash benchmarks/gpu/autotune_cache.sh save "$WORK/autotune" >/dev/null
    tar czf "$OUT/phase$phase.tgz" -C "$WORK" .
    echo "archived $(du -h "$OUT/phase$phase.tgz" | cut -f1) into phase$phase.tgz"
}
trap finish EXIT
db() { python3 -m deltabench.harness.cli "$@"; }
stamp() { echo "== $(date -u +%H:%M:%S) $*"; }

if [[ $phase == 1 ]]; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$WORK/gpu.txt"
    stamp gdn_kernels
    timeout 200 python3 benchmarks/gdn_kernels.py --skip-gate --impls triton_chunk,triton_chunk_split,fla_chunk \
        --out "$WORK" --tag v3 >"$WORK/gdn-kernels.log" 2>&1
    echo "gdn_kernels exit=$?"; grep -E "^\||FAIL|Error|error" "$WORK/gdn-kernels.log" | cut -c1-170 | tail -30
    stamp sdm-gpu
    # ours first (the chunked PyTorch reference may take its whole timeout at 32K), then the reference
    timeout 120 python3 -m deltabench.harness.cli run --suite sdm-gpu --device cuda --no-db --timeout 60 -q \
        --impl triton_chunk --impl triton_chunk_split --out "$WORK/sdm-gpu.json" --format markdown \
        >"$WORK/sdm-gpu.log" 2>&1
    echo "sdm-gpu exit=$?"; grep -E "^\|" "$WORK/sdm-gpu.log" | cut -c1-170 | tail -12
    timeout 75 python3 -m deltabench.harness.cli run --suite sdm-gpu --device cuda --no-db --timeout 70 -q \
        --op sdm --impl torch_chunk --out "$WORK/sdm-gpu-reference.json" --format markdown \
        >"$WORK/sdm-gpu-reference.log" 2>&1
    echo "sdm-gpu reference exit=$?"; grep -E "^\|" "$WORK/sdm-gpu-reference.log" | cut -c1-170 | tail -8
    stamp gdn2_pallas
    timeout 120 python3 benchmarks/gpu/gdn2_pallas.py --block-v 128,64 --dots fp32,bf16x3 \
        >"$WORK/gdn2-pallas.log" 2>&1
    echo "gdn2_pallas exit=$?"; tail -16 "$WORK/gdn2-pallas.log" | cut -c1-170
elif [[ $phase == 2 ]]; then
    db list --device cuda >"$WORK/list.txt" 2>&1; grep -iE "flash_qla|fla_chunk|unavail" "$WORK/list.txt" | head
    stamp train
    t0=$(date +%s)
    timeout 540 python3 -m deltabench.harness.cli run --suite train --device cuda --no-db --timeout 120 -q \
        --impl fla_chunk --impl flash_qla --impl triton_chunk --impl triton_chunk_split \
        --out "$WORK/train-h200.json" --format markdown >"$WORK/train-run.log" 2>&1
    echo "train exit=$? wall=$(($(date +%s) - t0)) s"
    grep -E "^\|" "$WORK/train-run.log" | cut -c1-170 | tail -45
    cp "$WORK/train-h200.json" "$OUT/" 2>/dev/null
elif [[ $phase == 3 ]]; then
    stamp speed-warm
    t0=$(date +%s.%N)
    timeout 170 python3 -m deltabench.harness.cli run --suite benchmarks/gpu/flashqla-h200.toml --device cuda --no-db \
        -q --out "$WORK/speed-warm.json" --format markdown >"$WORK/speed-warm.log" 2>&1
    rc=$?
    wall=$(python3 -c "import time; print(f'{time.time() - $t0:.1f}')")
    echo "speed warm exit=$rc wall=$wall s"
    python3 benchmarks/job_overhead.py "$WORK/speed-warm.json" --wall-s "$wall" | tee "$WORK/suite-speed-warm.md" | tail -20
    stamp calibration
    OUT=$WORK COLLECT_TIMEOUT_S=330 bash benchmarks/gpu/gate_calibration.sh 2>&1 | tail -25
    cp "$WORK/gate-calibration-h200.json" "$OUT/" 2>/dev/null
else
    echo "unknown phase $phase: use 1, 2 or 3"; exit 2
fi
