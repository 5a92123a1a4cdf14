#!/usr/bin/env bash
# One H200 session in back-to-back device calls (the machine stays warm 30 s after a call; a later call gets a bare
# one, and FlashQLA's two halves must then be carried again). FlashQLA's wheels come in two halves (README.md here),
# staged by stage_qla.sh in a site folder of their own that goes on PYTHONPATH once both are in, so FLA runs in
# phase 1 too.
#
#   here, first: git rev-parse HEAD > .deltabench-commit; bash benchmarks/gpu/fetch_wheels.sh (qla1, qla2 go to .gpucache/)
#   call 1, carry [.whl/base, .whl/fla, .whl/opengdn, .gpucache/qla1, .deltabench-commit]:  bash benchmarks/gpu/h200_session.sh 1
#   call 2, carry [.gpucache/qla2, .deltabench-commit], within 30 s:                         bash benchmarks/gpu/h200_session.sh 2
#   calls 3, 4, carry [.deltabench-commit], each within 30 s:                                bash benchmarks/gpu/h200_session.sh 3
#
# Phase 1: our Triton GDN beside FLA in one process (benchmarks/gdn_kernels.py: each impl checked against torch_chunk
# in fp32 at every train shape, then timed), a cProfile of one warm gate, the `train` suite gated for ours. Phase 2:
# the `train` suite for FlashQLA (cold: its compiles fill TileLang's cache). Phase 3: FlashQLA's train again on that
# cache, then FLA's. Phase 4: the 12-job comparison on these caches (flashqla-h200.toml, the harness's overhead per
# job), GDN-2's Pallas kernel for a GPU (gdn2_pallas.py), the sdm-gpu suite for sdm's Triton kernels. Every job's
# result lands in its document as it ends. The gate's calibration is its own call: gate_calibration.sh.
# A call returns at most 8 files: each phase leaves its document and one archive of everything under $OUT.
set -uo pipefail
phase=${1:?phase 1, 2, 3 or 4}
OUT=${OUT:-/tmp/out}
WORK=/tmp/work-$phase
mkdir -p "$OUT" "$WORK"
export PYTHONUNBUFFERED=1 FLA_FLASH_QLA=0
# the device copy has no .git: pass the commit along
export DELTABENCH_GIT_COMMIT=${DELTABENCH_GIT_COMMIT:-$(cat .deltabench-commit 2>/dev/null || true)}
bash benchmarks/gpu/install.sh >"$WORK/install.log" 2>&1 || { tail -40 "$WORK/install.log"; exit 1; }
tail -4 "$WORK/install.log"
qla=$(bash benchmarks/gpu/stage_qla.sh)
export PYTHONPATH=/tmp/site${qla:+:$qla}
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
    timeout 150 python3 benchmarks/gdn_kernels.py --skip-gate --impls triton_chunk,triton_chunk_split,fla_chunk \
        --out "$WORK" --tag v4 >"$WORK/gdn-kernels.log" 2>&1
    echo "gdn_kernels exit=$?"; grep -E "^\||FAIL|Error|error" "$WORK/gdn-kernels.log" | cut -c1-170 | tail -20
    stamp gate-profile
    # Where a compiled kernel's gate spends its 12-15 s on the GPU (the calibration runs' overhead per job): the
    # same verify twice, the second (warm caches) under cProfile.
    verify=(-m deltabench.harness.cli verify --op gdn --impl triton_chunk --shape B=8,T=4096,H=6,K=128,V=128
        --dtype bf16 --device cuda --seeds 1)
    timeout 80 python3 "${verify[@]}" >"$WORK/gate-warmup.log" 2>&1; echo "verify exit=$?"
    timeout 80 python3 -m cProfile -o "$WORK/gate.prof" "${verify[@]}" >"$WORK/gate-profiled.log" 2>&1
    echo "verify profiled exit=$?"
    python3 -c "import pstats; pstats.Stats('$WORK/gate.prof').sort_stats('cumulative').print_stats(30)" \
        2>/dev/null | cut -c1-150 | tail -36
    stamp train-ours
    # ours first: a run cut by the call's limit keeps what matters most (the runner goes impl by impl, in this order)
    t0=$(date +%s)
    timeout 260 python3 -m deltabench.harness.cli run --suite train --device cuda --no-db --timeout 150 -q \
        --impl triton_chunk_split --impl triton_chunk --out "$WORK/train-ours.json" --format markdown \
        >"$WORK/train-ours.log" 2>&1
    echo "train exit=$? wall=$(($(date +%s) - t0)) s"; grep -E "^\|" "$WORK/train-ours.log" | cut -c1-170 | tail -22
    cp "$WORK/train-ours.json" "$OUT/" 2>/dev/null
elif [[ $phase == 2 || $phase == 3 ]]; then
    # FlashQLA compiles each new shape (15-30 s a kernel) and the gate feeds it several: a cold job takes minutes.
    # Phase 2 fills TileLang's cache (jobs it finishes are kept); phase 3 runs the suite again on that cache, then FLA.
    db list --device cuda >"$WORK/list.txt" 2>&1; grep -iE "flash_qla|unavail" "$WORK/list.txt" | head -4
    stamp train-flashqla
    t0=$(date +%s)
    cap=540; [[ $phase == 3 ]] && cap=330
    timeout $cap python3 -m deltabench.harness.cli run --suite train --device cuda --no-db --timeout 300 -q \
        --impl flash_qla --out "$WORK/train-flashqla.json" --format markdown >"$WORK/train-flashqla.log" 2>&1
    echo "train exit=$? wall=$(($(date +%s) - t0)) s"; grep -E "^\|" "$WORK/train-flashqla.log" | cut -c1-170 | tail -14
    cp "$WORK/train-flashqla.json" "$OUT/" 2>/dev/null
    if [[ $phase == 3 ]]; then
        stamp train-fla
        timeout 210 python3 -m deltabench.harness.cli run --suite train --device cuda --no-db --timeout 120 -q \
            --impl fla_chunk --out "$WORK/train-fla.json" --format markdown >"$WORK/train-fla.log" 2>&1
        echo "train exit=$?"; grep -E "^\|" "$WORK/train-fla.log" | cut -c1-170 | tail -14
        cp "$WORK/train-fla.json" "$OUT/" 2>/dev/null
    fi
elif [[ $phase == 4 ]]; then
    stamp speed-warm
    t0=$(date +%s.%N)
    timeout 200 python3 -m deltabench.harness.cli run --suite benchmarks/gpu/flashqla-h200.toml --device cuda --no-db \
        -q --out "$WORK/speed-warm.json" --format markdown >"$WORK/speed-warm.log" 2>&1
    rc=$?
    wall=$(python3 -c "import time; print(f'{time.time() - $t0:.1f}')")
    echo "speed warm exit=$rc wall=$wall s"
    python3 benchmarks/job_overhead.py "$WORK/speed-warm.json" --wall-s "$wall" | tee "$WORK/suite-speed-warm.md" | tail -16
    stamp gdn2_pallas
    timeout 150 python3 benchmarks/gpu/gdn2_pallas.py --block-v 128 --dots bf16x3 >"$WORK/gdn2-pallas.log" 2>&1
    echo "gdn2_pallas exit=$?"; tail -12 "$WORK/gdn2-pallas.log" | cut -c1-170
    stamp sdm-gpu
    # the flagship shape's gate (full-shape reference, oracle, determinism in a fresh process) took > 60 s
    timeout 180 python3 -m deltabench.harness.cli run --suite sdm-gpu --device cuda --no-db --timeout 170 -q \
        --impl triton_chunk --out "$WORK/sdm-gpu.json" --format markdown >"$WORK/sdm-gpu.log" 2>&1
    echo "sdm-gpu exit=$?"; grep -E "^\|" "$WORK/sdm-gpu.log" | cut -c1-170 | tail -12
else
    echo "unknown phase $phase: use 1, 2, 3 or 4"; exit 2
fi
