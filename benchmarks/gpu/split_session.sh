#!/usr/bin/env bash
# One GPU call for triton_chunk_split : install, then a phase.
#
#   bash benchmarks/gpu/split_session.sh diag    # stage-by-stage checks at the train shapes, variants and
#                                                # compute-sanitizer where the base faults
#   bash benchmarks/gpu/split_session.sh tune    # launch-config sweep of every stage (KERNELS, TUNE_SHAPES)
#   bash benchmarks/gpu/split_session.sh bench   # gate (quick) + check and time beside FLA (gdn_kernels.py)
#
# Run from the checkout root on the GPU machine; wheels are read from $DELTABENCH_WHEELS (default .whl).
# Logs go to $OUT (or ./out).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
mkdir -p "$OUT"
bash benchmarks/gpu/install.sh >"$OUT/install.log" 2>&1 || { tail -20 "$OUT/install.log"; exit 1; }
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
SHAPES=(8,4096,6,128 1,32768,16,128 4,8192,16,128 4,4096,6,128 1,1024,6,128)
dbg() { timeout "$1" python3 benchmarks/gpu/split_debug.py "${@:2}" 2>&1 | grep -v "^\s*$" | tee -a "$OUT/diag.log"; }

case ${1:-diag} in
diag)
    failed=()
    for s in "${SHAPES[@]}"; do
        dbg 150 check "$s" --reps 5 || failed+=("$s")
    done
    echo "base check failed at: ${failed[*]:-none}"
    if [[ ${#failed[@]} -gt 0 ]]; then
        for v in out-w4 out-bv128 walk-w4 walk-s2; do dbg 90 check "${failed[0]}" --variant "$v" --reps 5 --fwd-only; done
        PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 150 compute-sanitizer --tool memcheck --print-limit 8 \
            python3 benchmarks/gpu/split_debug.py check "${failed[0]}" --reps 1 --fwd-only >"$OUT/sanitizer.log" 2>&1
        grep -v "^=========     " "$OUT/sanitizer.log" | head -40
    fi
    ;;
tune)
    # each kernel's launch configs at one shape of each class; a config that faults ends its process, and the
    # next process starts after it
    for kernel in ${KERNELS:-walk state_bwd output wy local_bwd}; do
        for s in ${TUNE_SHAPES:-8,4096,6,128 1,32768,16,128}; do
            skip=0
            for attempt in 1 2 3; do
                dbg 120 tune "$s" --kernel "$kernel" --skip "$skip" >/dev/null && break
                last=$(grep "^try $kernel $s " "$OUT/diag.log" | tail -1 | awk '{print $4}')
                echo "tune $kernel $s: config $last FAULTED or timed out"
                skip=$((last + 1))
            done
        done
    done
    grep "^tune\|FAULT" "$OUT/diag.log"
    ;;
sanitize)
    # compute-sanitizer memcheck over the split forward at a shape of each walk class (16- and 64-column)
    for s in 1,1024,6,128 2,1024,32,128; do
        PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 120 compute-sanitizer --tool memcheck --print-limit 4 \
            python3 benchmarks/gpu/split_debug.py check "$s" --reps 1 --fwd-only >"$OUT/sanitizer-${s//,/x}.log" 2>&1
        echo "sanitizer $s: $(grep -c '"ok": true' "$OUT/sanitizer-${s//,/x}.log") ok lines; $(grep 'ERROR SUMMARY' "$OUT/sanitizer-${s//,/x}.log")"
    done
    ;;
call2)
    # v1 (walk fix) verified at the five shapes, launch sweeps and compute-sanitizer, then v1 beside FLA.
    # Phase 1 in parallel (compiles: CPU-bound; their GPU time is not measured), phase 2 measures alone.
    for s in "${SHAPES[@]}"; do dbg 200 check "$s" --reps 2 >/dev/null & done
    for job in "walk16 1,32768,16,128" "state_bwd 8,4096,6,128" "state_bwd 1,32768,16,128" \
        "wy 8,4096,6,128" "local_bwd 8,4096,6,128"; do
        set -- $job
        dbg 200 tune "$2" --kernel "$1" --compile-only >/dev/null &
    done
    bash "$0" sanitize >/dev/null 2>&1 &
    wait
    grep "^{" "$OUT/diag.log" | grep -v '"ok": true, "h"' | cut -c1-400
    grep -h "ERROR SUMMARY" "$OUT"/sanitizer-*.log
    for job in "walk16 1,32768,16,128" "state_bwd 8,4096,6,128" "state_bwd 1,32768,16,128" \
        "wy 8,4096,6,128" "local_bwd 8,4096,6,128"; do
        KERNELS=${job% *} TUNE_SHAPES=${job#* } bash "$0" tune >/dev/null 2>&1
    done
    grep "^tune\|FAULT" "$OUT/diag.log"
    bash "$0" bench --skip-gate --impls triton_chunk_split,triton_chunk,fla_chunk --tag v1
    ;;
call3)
    # v2 (tuned launches) gated and sanitised, local_bwd's two-launch variant swept, then both beside FLA.
    python3 benchmarks/gdn_kernels.py --gate-only quick >"$OUT/gate.log" 2>&1 &
    for s in "${SHAPES[@]}"; do dbg 150 check "$s" --reps 1 >/dev/null & done
    for s in 8,4096,6,128 1,32768,16,128; do dbg 150 tune "$s" --kernel local_bwd2 --compile-only >/dev/null & done
    for s in 1,1024,6,128 2,1024,32,128; do
        PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout 150 compute-sanitizer --tool memcheck --print-limit 4 \
            python3 benchmarks/gpu/split_debug.py check "$s" --reps 1 >"$OUT/sanitizer-${s//,/x}.log" 2>&1 &
    done
    wait
    grep -h "ERROR SUMMARY\|fwd+bwd ok" "$OUT"/sanitizer-*.log | cut -c1-120
    grep "^gate\|crash" "$OUT/gate.log" | cut -c1-160
    grep "^{" "$OUT/diag.log" | grep -v '"ok": true, "h"' | cut -c1-300
    KERNELS=local_bwd2 TUNE_SHAPES="8,4096,6,128 1,32768,16,128" bash "$0" tune 2>&1 | grep "^tune\|FAULT"
    bash "$0" bench --skip-gate --impls triton_chunk_split,triton_chunk,fla_chunk --tag v2
    ;;
gate-other-k)
    # the oracle gate at the head sizes outside wy.TUNED_K (K = 64 and 256), two processes side by side
    python3 benchmarks/gdn_kernels.py --gate-only k64 >"$OUT/gate-k64.log" 2>&1 &
    python3 benchmarks/gdn_kernels.py --gate-only k256 >"$OUT/gate-k256.log" 2>&1 &
    wait
    grep -h "^gate\|crash" "$OUT"/gate-k*.log | cut -c1-150
    ;;
bench)
    python3 benchmarks/gdn_kernels.py --gate quick --out "$OUT" "${@:2}" 2>&1 | tee "$OUT/bench.log"
    ;;
esac
