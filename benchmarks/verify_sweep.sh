#!/usr/bin/env bash
# `deltabench verify` for every built-in impl that runs on this machine, x op, x fp32/bf16, x both gate regimes
# (each run checks with and without an initial state, two fixed seeds plus one drawn, every gradient). Triton
# impls run under the interpreter on a CPU. Prints one line per run; exit 1 if any failed.
#   bash benchmarks/verify_sweep.sh [--device cpu] [--shape B=2,T=70,H=3,K=16,V=32]
set -uo pipefail
device=cpu
shape=B=2,T=70,H=3,K=16,V=32
while [[ $# -gt 0 ]]; do
    case $1 in
        --device) device=$2; shift 2 ;;
        --shape) shape=$2; shift 2 ;;
        *) echo "verify_sweep.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
# on a CPU, Triton impls run under the interpreter (as `deltabench verify --device cpu` does by itself)
[[ $device == cpu ]] && export TRITON_INTERPRET=1
pairs=$(deltabench list --device "$device" --json | python3 -c '
import json, sys
for r in json.load(sys.stdin)["impls"]:
    if r["available"]:
        print(r["op"] + ":" + r["impl"])')
failed=0
for pair in $pairs; do
    op=${pair%%:*}; impl=${pair##*:}
    for dtype in fp32 bf16; do
        for regime in typical long; do
            start=$(date +%s)
            if deltabench verify --op "$op" --impl "$impl" --shape "$shape" --dtype "$dtype" --regime "$regime" \
                --device "$device" --seeds 2 >/dev/null 2>&1; then verdict=PASS; else verdict=FAIL; failed=1; fi
            echo "$verdict $op $impl $dtype $regime $(($(date +%s) - start))s"
        done
    done
done
exit $failed
