#!/usr/bin/env bash
# One GPU call for triton_chunk_split (issue 15): install, then a phase.
#
#   bash benchmarks/gpu/split_session.sh diag    # stage-by-stage checks at the train shapes, variants and
#                                                # compute-sanitizer where the base faults, launch sweeps
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
    dbg 150 sweep 1,32768,16,128
    dbg 120 sweep 8,4096,6,128
    ;;
bench)
    python3 benchmarks/gdn_kernels.py --gate quick --out "$OUT" "${@:2}" 2>&1 | tee "$OUT/bench.log"
    ;;
esac
