#!/usr/bin/env bash
# The end of a device session in two calls on nvidia-h200-x2, when the lanes (h200_lanes.sh) were lost: call 1
# installs (carry .whl/base, .whl/fla, .whl/opengdn, .whl/sdm, .gpucache/qla1, .deltabench-commit), call 2 (carry
# .gpucache/qla2, .deltabench-commit) stages FlashQLA's second half and runs, side by side and within the call:
# GPU 0, the 12-job comparison from empty caches then the sdm flagship at 32K; GPU 1, the sdm flagship at 8K and the
# dense limit beside gdn. Everything written lands in $OUT/tail.tgz.
#
#   bash benchmarks/gpu/h200_tail.sh install        (call 1)
#   bash benchmarks/gpu/h200_tail.sh run CAP_S      (call 2: returns by CAP_S seconds)
set -uo pipefail
cd "$(dirname "$0")/../.."
L=/tmp/tail
export PYTHONUNBUFFERED=1 FLA_FLASH_QLA=0 OMP_NUM_THREADS=8 TRITON_CACHE_DIR=/tmp/triton-cache
export DELTABENCH_GIT_COMMIT=${DELTABENCH_GIT_COMMIT:-$(cat .deltabench-commit 2>/dev/null || true)}
mkdir -p "$L" "${OUT:-/tmp/out}"

# job NAME CAP ARGS: one `deltabench run` (document and log under $L), its table printed
job() {
    local name=$1 cap=$2 t0
    shift 2
    t0=$(date +%s)
    PYTHONPATH=/tmp/site:/tmp/site-qla timeout "$cap" python3 -m deltabench.cli.app run --device cuda --no-db -q \
        --out "$L/$name.json" --format markdown "$@" >"$L/$name.log" 2>&1
    echo "== $name exit=$? wall=$(($(date +%s) - t0)) s" | tee -a "$L/walls.txt"
    grep -E "^\|" "$L/$name.log" | cut -c1-200
}

gpu0() {
    local caches=/tmp/cold-caches t0
    export CUDA_VISIBLE_DEVICES=0
    rm -rf "$caches"
    t0=$(date +%s.%N)
    TRITON_CACHE_DIR=$caches/triton TILELANG_CACHE_DIR=$caches/tilelang DELTABENCH_JAX_CACHE_DIR=$caches/jax \
        DELTABENCH_REFERENCE_CACHE=$caches/references job speed-cold-gate4 240 \
        --suite benchmarks/gpu/flashqla-h200.toml --gate-workers 4
    PYTHONPATH=/tmp/site python3 benchmarks/job_overhead.py "$L/speed-cold-gate4.json" --wall-s \
        "$(python3 -c "import time; print(f'{time.time() - $t0:.1f}')")" >"$L/speed-cold-gate4-overhead.md" 2>&1
    tail -2 "$L/speed-cold-gate4-overhead.md"
    job sdm-32k "$1" --suite benchmarks/gpu/sdm-h200-32k.toml --gate-workers 2
}

gpu1() {
    export CUDA_VISIBLE_DEVICES=1
    job sdm-short "$1" --suite benchmarks/gpu/sdm-h200-short.toml --gate-workers 6
}

case ${1:-} in
    install)
        bash benchmarks/gpu/install.sh >"$L/install.log" 2>&1 || { tail -30 "$L/install.log"; exit 1; }
        bash benchmarks/gpu/stage_qla.sh >>"$L/install.log" 2>&1
        tail -3 "$L/install.log"
        ;;
    run)
        cap=${2:-400}
        bash benchmarks/gpu/stage_qla.sh >>"$L/install.log" 2>&1
        nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv >"$L/gpu.txt"
        start=$(date +%s)
        gpu0 $((cap - 250)) >"$L/gpu0.log" 2>&1 &
        gpu1 $((cap - 15)) >"$L/gpu1.log" 2>&1 &
        wait
        echo "both GPUs done after $(($(date +%s) - start)) s"
        cat "$L/walls.txt"
        tar czf "$OUT/tail.tgz" -C "$L" .
        ;;
    *) echo "usage: h200_tail.sh install | run CAP_S" >&2; exit 2 ;;
esac
