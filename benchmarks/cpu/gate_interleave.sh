#!/usr/bin/env bash
# Same-code and planted-slowdown gates of `deltabench run --base-ref HEAD` (base and head interleaved in one
# invocation) on this machine as it is: K same-code invocations (head = the checkout, base = its HEAD commit) and
# K planted ones (the head alone imports planted_slowdown.py from an untracked copy inside the checkout, so the
# base side does not import it: runners/interleave.py, base_imports), alternating, each graded by `deltabench gate`.
#   K=5 REPEAT=7 OUT=/tmp/gate-interleave benchmarks/cpu/gate_interleave.sh [extra run options, e.g. --op gdn]
# KINDS="planted" runs the planted invocations only (KINDS="same planted" by default).
# Writes OUT/{same,planted}-i.{json,base.json,gate.json,gate.txt} and OUT/log.tsv (kind, i, load average, gate rc,
# wall seconds).
set -u
K=${K:-5}
REPEAT=${REPEAT:-7}
OUT=${OUT:-/tmp/gate-interleave}
SUITE=${SUITE:-benchmarks/cpu/gate-repeat.toml}
DB=${DB:-.venv/bin/deltabench}
mkdir -p "$OUT"
PLANTED_DIR=${PLANTED_DIR:-.planted-head}  # untracked: absent from the base tree
mkdir -p "$PLANTED_DIR"
cp benchmarks/cpu/planted_slowdown.py "$PLANTED_DIR/planted_slowdown.py"
trap 'rm -rf "$PLANTED_DIR"' EXIT
for i in $(seq 1 "$K"); do
  for kind in ${KINDS:-same planted}; do
    extra=()
    if [ "$kind" = planted ]; then extra=(--import "$PLANTED_DIR/planted_slowdown.py"); fi
    load=$(cut -d' ' -f1 /proc/loadavg)
    t0=$(date +%s)
    DELTABENCH_PLANTED_SLOWDOWN=0.20 DELTABENCH_PLANTED_IMPL=gdn/torch_chunk \
      "$DB" run --suite "$SUITE" --repeat "$REPEAT" --base-ref HEAD --no-db -q --format csv \
      --out "$OUT/$kind-$i.json" "${extra[@]}" "$@" > "$OUT/$kind-$i.run.txt" 2>&1
    t1=$(date +%s)
    "$DB" gate --base "$OUT/$kind-$i.base.json" --head "$OUT/$kind-$i.json" --json "$OUT/$kind-$i.gate.json" \
      > "$OUT/$kind-$i.gate.txt" 2>&1
    rc=$?
    load2=$(cut -d' ' -f1 /proc/loadavg)
    printf '%s\t%s\t%s-%s\t%s\t%s\n' "$kind" "$i" "$load" "$load2" "$rc" "$((t1 - t0))" | tee -a "$OUT/log.tsv"
  done
done
