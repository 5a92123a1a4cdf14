#!/usr/bin/env bash
# `deltabench verify` for every built-in impl that runs on this machine, x op, x fp32/bf16. Each run covers the
# three gate regimes (typical, long, strong), with and without an initial state, a non-default scale, q and k off
# the unit sphere, the input check and the length sweep, over --seeds consecutive seeds (default 20) plus one
# drawn, every gradient. Triton impls run under the interpreter on a CPU. Prints one line per run with the worst
# value over its bound per family; exit 1 if any failed.
#   bash benchmarks/verify_sweep.sh [--device cpu] [--shape B=2,T=70,H=3,K=16,V=32] [--seeds 20] [--impl NAME]...
set -uo pipefail
device=cpu
shape=B=2,T=70,H=3,K=16,V=32
seeds=20
impls=()
while [[ $# -gt 0 ]]; do
    case $1 in
        --device) device=$2; shift 2 ;;
        --shape) shape=$2; shift 2 ;;
        --seeds) seeds=$2; shift 2 ;;
        --impl) impls+=("$2"); shift 2 ;;
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
summary='
import json, sys
r = json.load(sys.stdin)
if "records" not in r:
    print("error:", r.get("error")); sys.exit()
worst = {}
for x in r["records"]:
    if x["metric"] == "rel_fro" and x["threshold"]:
        fam = x["check"].split(":")[0] if not x["check"].startswith("grad") else "grad"
        v = float("inf") if x["value"] is None else x["value"] / x["threshold"]
        worst[fam] = max(worst.get(fam, 0), v)
print(len(r["records"]), "records; worst/bound", " ".join(f"{k}={v:.2f}" for k, v in worst.items()))'
for pair in $pairs; do
    op=${pair%%:*}; impl=${pair##*:}
    if [[ ${#impls[@]} -gt 0 && ! " ${impls[*]} " == *" $impl "* ]]; then continue; fi
    for dtype in fp32 bf16; do
        start=$(date +%s)
        out=$(deltabench verify --op "$op" --impl "$impl" --shape "$shape" --dtype "$dtype" --device "$device" \
            --seeds "$seeds" --json 2>/dev/null)
        if [[ $? -eq 0 ]]; then verdict=PASS; else verdict=FAIL; failed=1; fi
        echo "$verdict $op $impl $dtype $(($(date +%s) - start))s $(echo "$out" | python3 -c "$summary")"
    done
done
exit $failed
