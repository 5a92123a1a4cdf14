#!/usr/bin/env bash
# One device session on a two-GPU machine (nvidia-h200-x2) whose work runs in two lanes that outlive the calls; on a
# one-GPU machine (nvidia-h200) one lane does the untimed work first, then the timed (lane_solo, below).
#
# A call's processes end when it returns, except those started in a process session of their own (setsid). Once
# both halves of FlashQLA are staged (call 2), a call starts lane A on GPU 0 and lane B on GPU 1 that way; every
# call (the same command) then waits while they work, prints their progress and archives all they have written so
# far into $OUT/lanes.tgz. So the GPUs never idle between calls, and a session cut short keeps what finished.
#
#   here, first: git rev-parse HEAD > .deltabench-commit; bash benchmarks/gpu/fetch_wheels.sh
#   call 1, kind nvidia-h200-x2, carry [.whl/base, .whl/fla, .whl/opengdn, .whl/atomic, .whl/sdm, .gpucache/qla1,
#       .deltabench-commit]:
#       bash benchmarks/gpu/h200_lanes.sh call 0          (installs; about 40 s)
#   call 2 at once, carry [.gpucache/qla2, .deltabench-commit]:  bash benchmarks/gpu/h200_lanes.sh call 540
#       (LANE_SDM_PKG=0 bash ... when call 3 brings SDM 2.0.0's build: then the lane does not build it)
#   calls 3.., each at once, carry [.deltabench-commit]:          bash benchmarks/gpu/h200_lanes.sh call 540
#       (call 3 may carry .gpucache/sdm-ext too: the sdm-ext.tgz.part-* files an earlier session's call brought
#       back, SDM 2.0.0's built extensions, unpacked before the lane reaches task sdm_pkg)
# "At once" is literal: the machine is given back after 30 s idle and the lanes with it. Fire the next call before
# reading the last one's archive (2026-12-01: a fourth call sent after a minute's reading found a bare machine).
#
# Lane A (GPU 0, the timings the issues compare): the whole `train` suite in one run, every impl (deltabench's
# kernels, FLA, FlashQLA, then the rest), its gates four at a time (the run builds FlashQLA's kernels first, side by
# side), then the 12-job comparison (flashqla-h200.toml) on warm caches with four. Lane B (GPU 1): the 20-seed
# verify sweep of the GPU impls (six lines at once), then the sdm-gpu suite (SDM 2.0.0's CUDA extensions build in the background from the
# lane's start). A lane done with its own work takes the next task of a shared queue: the 12-job comparison from
# empty caches (its own cache folders), GDN-2's Pallas kernel for a GPU (gdn2_pallas.py), the gdn2-gpu and gdn2-tpu
# suites, gdn_kernels.py's stage times (ours beside FLA, one process), the warm comparison gated job by job. Both lanes share the
# host's CPUs (32 cores; each lane's torch keeps to 8 threads): each lane's work is the other's concurrent load.
set -uo pipefail
cd "$(dirname "$0")/../.."
L=${DELTABENCH_LANES:-/tmp/lanes}
QLA=/tmp/site-qla
export PYTHONUNBUFFERED=1 FLA_FLASH_QLA=0 OMP_NUM_THREADS=8
export DELTABENCH_GIT_COMMIT=${DELTABENCH_GIT_COMMIT:-$(cat .deltabench-commit 2>/dev/null || true)}
export TRITON_CACHE_DIR=/tmp/triton-cache TORCH_EXTENSIONS_DIR=/tmp/torch_extensions MAX_JOBS=6
export PATH=/tmp/site/bin:$PATH  # the sdm set's ninja, for SDM 2.0.0's extension build

stamp() { echo "== $(date -u +%H:%M:%S) $*"; }
qla_staged() { [[ -f $QLA/.deltabench-sets/qla1 && -f $QLA/.deltabench-sets/qla2 ]]; }
# LANE_QLA=0: a session that needs no FlashQLA starts its lanes in call 1, without the two calls that stage it
lanes_ready() { [[ ${LANE_QLA:-1} == 0 ]] || qla_staged; }
# FlashInfer's folders (set `flashinfer`, one part a call) once stage_flashinfer.sh installed all of its parts
fi_staged() { [[ -f /tmp/site-fi/.deltabench-installed ]]; }
# FlashQLA's folder joins the path only once both halves are in (a half-installed TileLang breaks FLA's import).
# deltabench from this tree first: a lane runs from its own copy (call, below), not from the checkout that each
# call re-sends under it
pypath() {
    local path=$PWD/src:/tmp/site
    qla_staged && path+=":$QLA"
    fi_staged && path+=":/tmp/site-fi:/tmp/site-fi/nvidia_cutlass_dsl/dsl_packages"
    echo "$path"
}
db() { PYTHONPATH=$(pypath) python3 -m deltabench.cli.app "$@"; }
# run CAP NAME ARGS...: one `deltabench run` cut at CAP seconds, its document under the lane's folder, table printed
run() {
    local cap=$1 name=$2 t0
    shift 2
    stamp "$name"
    t0=$(date +%s)
    # not -q: the log gets a line per gate and per job as each ends (where a run cut by its cap spent its time)
    PYTHONPATH=$(pypath) timeout "$cap" python3 -m deltabench.cli.app run --device cuda --no-db \
        --out "$dir/$name.json" --format markdown "$@" >"$dir/$name.log" 2>&1
    echo "$name exit=$? wall=$(($(date +%s) - t0)) s"
    grep -E "^\|" "$dir/$name.log" | cut -c1-170
}

# ok_jobs DOC: how many of the document's jobs ended ok (0 when it is missing or unreadable)
ok_jobs() {
    python3 -c "import json, sys; print(sum(j['status'] == 'ok' for j in json.load(open(sys.argv[1]))['jobs']))" \
        "$1" 2>/dev/null || echo 0
}

# run_gated CAP NAME WORKERS ARGS...: `run` with the gates WORKERS at once; once more one at a time when no job
# ended ok that way (--gate-workers is new on a GPU: a fault of its own must not cost the table)
run_gated() {
    local cap=$1 name=$2 workers=$3
    shift 3
    run "$cap" "$name" --gate-workers "$workers" "$@"
    if (($(ok_jobs "$dir/$name.json") == 0)); then
        tail -5 "$dir/$name.log"
        run "$cap" "$name-serial-gates" "$@"
    fi
}

lane_a() {
    dir=$L/a
    task_train  # the whole suite, every impl, in one run (issue 16's 10-minute target is for this run)
    speed warm-gate4 200 --gate-workers 4  # the gates four at a time before the timings
    shared
}

# speed LABEL CAP [RUN ARGS]: the 12-job comparison, its wall clock and per-job overhead (benchmarks/job_overhead.py)
speed() {
    local t0
    t0=$(date +%s.%N)
    run "$2" "speed-$1" --suite benchmarks/gpu/flashqla-h200.toml "${@:3}"
    PYTHONPATH=$(pypath) python3 benchmarks/job_overhead.py "$dir/speed-$1.json" --wall-s \
        "$(python3 -c "import time; print(f'{time.time() - $t0:.1f}')")" >"$dir/speed-$1-overhead.md" 2>&1
    tail -4 "$dir/speed-$1-overhead.md"
}

# SDM 2.0.0 builds its CUDA extensions on its first call (over 8 minutes on the H200, benchmarks/gpu/README.md): one
# verify at a tiny shape builds them in the background while the lane does other work.
sdm_pkg_build() {
    local cap=${1:-1500}
    OMP_NUM_THREADS=2 PYTHONPATH=$(pypath) timeout "$cap" python3 -m deltabench.cli.app verify --op sdm \
        --impl sdm_pkg_chunk --shape B=1,T=70,H=3,S=64,D=16,W=4,R=4 --dtype bf16 --seeds 1 --device cuda \
        --timeout $((cap - 50)) >"$dir/sdm-pkg-build.log" 2>&1
    echo "exit=$?" >"$dir/sdm-pkg-build.done"
}

# sdm_pkg_ready WAIT_S: waits up to WAIT_S seconds for that build to end and says how it ended; true when it ended
# well (SDM 2.0.0's jobs only then: otherwise each job would build it again, into its timeout)
sdm_pkg_ready() {
    local marker=$dir/sdm-pkg-build.done
    for _ in $(seq $(($1 / 5))); do [[ -f $marker ]] && break; sleep 5; done
    echo "sdm_pkg build: $(cat "$marker" 2>/dev/null || echo 'not finished')"
    grep -q "exit=0" "$marker" 2>/dev/null
}

lane_b() {
    dir=$L/b
    sdm_pkg_build &
    sweep 900
    stamp "waiting for SDM 2.0.0's build"
    sdm_gpu 900 2
    shared
}

# sweep CAP [VERIFY_SWEEP ARGS]: the 20-seed verify sweep of the GPU impls, one child process a line (a kernel that faults costs its own
# line), six at once, at K=V=128: the GPU kernels' shape; a line compiles per length (the Pallas kernel ~60 s a
# length): up to 600 s a line
sweep() {
    stamp verify-sweep
    PYTHONPATH=$(pypath) timeout "$1" python3 benchmarks/gpu/verify_sweep.py --seeds 20 --wide-only "${@:2}" \
        --line-timeout $(($1 < 600 ? $1 - 20 : 600)) --jobs 6 >"$dir/verify-sweep.log" 2>&1
    echo "verify_sweep exit=$?"; grep -E "^(PASS|FAIL|SKIP)|line\(s\)" "$dir/verify-sweep.log" | cut -c1-170
}

# sdm_gpu CAP WORKERS: the sdm-gpu suite, its gates WORKERS at once (on one GPU two gates of the flagship ended
# none in 420 s; one at a time, seven jobs in 280 s); SDM 2.0.0's jobs once its build ended well
sdm_gpu() {
    local pkg=()
    sdm_pkg_ready 300 && pkg=(--impl sdm_pkg_chunk)
    run_gated "$1" sdm-gpu "$2" --suite sdm-gpu --timeout $(($1 - 60)) --impl triton_chunk --impl torch_chunk \
        "${pkg[@]}" --impl triton_chunk_split
}

# One GPU (nvidia-h200): one lane. With LANE_SWEEP=1 the whole verify sweep first (six lines at once: all 32 lines
# in 573 s on 2026-12-01 10:34), with LANE_TRAIN=1 the train suite, then the queue (LANE_QUEUE, or the default
# below). SDM 2.0.0's extension build runs beside on the CPU unless LANE_SDM_PKG=0.
lane_solo() {
    dir=$L/a
    # SDM 2.0.0's CUDA extensions build on the CPU beside the GPU work (6 of 16 cores), for task sdm_pkg
    [[ ${LANE_SDM_PKG:-1} == 1 && ! -f $dir/sdm-pkg-build.done ]] && { sdm_pkg_build 1500 & }
    # the whole sweep ended in one run at 10:34 on 2026-12-01: again only when asked for
    [[ ${LANE_SWEEP:-0} == 1 ]] && sweep 720 --exclude sdm_pkg_chunk  # SDM 2.0.0's build: a session of its own
    # the train table (run 40c2995932a3 in benchmarks/results/store.sqlite: 100 jobs in 508 s from a fresh machine):
    # first with LANE_TRAIN=1, or as task
    # train in the queue
    [[ ${LANE_TRAIN:-0} == 1 ]] && task_train
    shared
}

# issue 13's targets: sdm-h200-short whole (torch_chunk beside triton_chunk at the flagship 8K and the dense limit,
# fwd and fwd+bwd: the 10x ratio and the dense limit against gdn in one table; torch_chunk's fwd+bwd failed the
# determinism gate at 20:48 on 2026-12-01, now summed in a fixed order), then the 32K fwd+bwd peak (its gate did
# not end in 400 s with the one-kernel steps)
task_sdm_gpu() {
    # five gates at once: three impls' chains, the two sdm ones halved to fill the places (an impl's four gates one
    # after another were the long pole at 00:37 on 2026-12-02), each gate held to a fifth of the GPU's memory
    run 600 sdm-short --suite benchmarks/gpu/sdm-h200-short.toml --timeout 500 --gate-workers 5
    task_sdm_32k
}

# the flagship table alone, its gates one at a time (five at once ran out of memory, 2026-12-02 03:41): ~8-9 minutes
task_sdm_flagship() { run 600 sdm-flagship --suite benchmarks/gpu/sdm-h200-flagship.toml --timeout 500; }
task_sdm_dense() { run 400 sdm-dense --suite benchmarks/gpu/sdm-h200-dense.toml --timeout 380 --gate-workers 2; }
# the sdm-gpu suite whole, in parts by shape (each a document of its own, a part cut by its cap costs only its own
# jobs), then merged into one table (benchmarks/merge_runs.py): the dense limit beside gdn, the 32K fwd+bwd peak,
# then the flagship at 8K with SDM 2.0.0's op beside ours, last so that its build (~13 minutes beside) has ended.
task_sdm_gpu_parts() {
    local impls=(--impl torch_chunk --impl triton_chunk --impl triton_chunk_split) parts=() part
    # the dense limit against gdn without torch_chunk: its fwd+bwd gate (198 s, 45 GiB) ran the others out of memory
    # and the part out of its cap before sdm's rows were timed (2026-12-02 07:23)
    run 420 sdm-gpu-dense --suite sdm-gpu --shape B=1,T=8192,H=2,S=128,D=128,W=128,R=128 \
        --shape B=1,T=8192,H=2,K=128,V=128 "${impls[@]:2}" --timeout 380 --gate-workers 3
    run 600 sdm-gpu-32k --suite sdm-gpu --shape B=1,T=32768,H=2,S=65536,D=1024,W=64,R=64 --impl triton_chunk \
        --timeout 560
    sdm_pkg_ready 300 && impls+=(--impl sdm_pkg_chunk)
    # two gates at once: a fwd+bwd gate here holds ~42 GiB (three at once ran out of memory, 2026-12-02 13:10) and
    # takes ~285 s beside another (07:16)
    run 600 sdm-gpu-8k --suite sdm-gpu --shape B=1,T=8192,H=2,S=65536,D=1024,W=64,R=64 "${impls[@]}" \
        --timeout 560 --gate-workers 2
    for part in 8k dense 32k; do [[ -f $dir/sdm-gpu-$part.json ]] && parts+=("$dir/sdm-gpu-$part.json"); done
    # the table straight from the merged document: the GPU host has no database layer (sqlalchemy)
    PYTHONPATH=$(pypath) python3 benchmarks/merge_runs.py "${parts[@]}" --out "$dir/sdm-gpu.json" \
        --format markdown >"$dir/sdm-gpu.md" 2>&1
    echo "sdm-gpu merged from ${#parts[@]} parts: exit=$?"; grep -E "^\|" "$dir/sdm-gpu.md" | cut -c1-170
}

task_sdm_32k() { run 540 sdm-32k --suite benchmarks/gpu/sdm-h200-32k.toml --timeout 520; }  # 400 s ran out

# SDM 2.0.0's own op beside ours at the flagship, once its build (sdm_pkg_build) has ended well; a while's wait for it
task_sdm_pkg() {
    if ! sdm_pkg_ready 180; then
        echo "sdm_pkg: skipped"
        tail -5 "$dir/sdm-pkg-build.log"
        return
    fi
    # SDM_PKG_ARGS: filters for a short session (e.g. "--mode fwd+bwd --impl sdm_pkg_chunk"), SDM_PKG_CAP its cap
    # shellcheck disable=SC2086
    run "${SDM_PKG_CAP:-480}" sdm-pkg --suite benchmarks/gpu/sdm-h200-pkg.toml --timeout $((${SDM_PKG_CAP:-480} - 20)) \
        ${SDM_PKG_ARGS:-}
}

# Work either lane takes when its own is done, in this order (a queue file: each task runs once).
task_gdn2_pallas() {
    stamp gdn2_pallas
    # the Pallas kernels beside jax_chunk (4.62 / 13.4 ms at dots=bf16 at 19:35 on 2026-12-02, the walks then at all
    # of V and 4 warps), each kernel's time apart (--stages). The tilings (comma lists; unset: pallas_gpu_chunk's
    # defaults): GDN2_BLOCK_V, GDN2_DOTS, GDN2_WARPS, GDN2_NUM_STAGES, GDN2_GRADS_WARPS (the gradient kernel's own
    # warps), GDN2_WALK_WARPS (the walks'); GDN2_LOG: the log's name, GDN2_CAP: its cap
    local log=$dir/${GDN2_LOG:-gdn2-pallas}.log
    PYTHONPATH=$(pypath) timeout "${GDN2_CAP:-420}" python3 benchmarks/gpu/gdn2_pallas.py \
        --block-v "${GDN2_BLOCK_V:-64}" --warps "${GDN2_WARPS:-4}" --num-stages "${GDN2_NUM_STAGES:-1}" \
        --grads-warps "${GDN2_GRADS_WARPS:-}" --walk-warps "${GDN2_WALK_WARPS:-}" \
        --dots "${GDN2_DOTS:-bf16}" --stages --no-fla >"$log" 2>&1
    echo "gdn2_pallas exit=$?"; tail -20 "$log" | cut -c1-170
}
# the per-chunk kernels taken apart (gdn2_pallas_parts.py): which part of each costs; GDN2_WARPS as above,
# GDN2_PARTS: the kernels to take apart, GDN2_PARTS_DOTS their products (bf16x3 or bf16), GDN2_PARTS_GRADS_WARPS
# the gradient kernel's warps (one number: gdn2_pallas's GDN2_GRADS_WARPS is a list), GDN2_PARTS_LOG the log
task_gdn2_parts() {
    stamp gdn2_parts
    local log=$dir/${GDN2_PARTS_LOG:-gdn2-parts}.log
    # shellcheck disable=SC2086
    PYTHONPATH=$(pypath) timeout "${GDN2_CAP:-420}" python3 benchmarks/gpu/gdn2_pallas_parts.py \
        --warps "${GDN2_WARPS:-4}" ${GDN2_PARTS_GRADS_WARPS:+--grads-warps "$GDN2_PARTS_GRADS_WARPS"} \
        --dots "${GDN2_PARTS_DOTS:-bf16}" --only "${GDN2_PARTS:-prepare,gradients}" ${GDN2_WALK_TILINGS:+--walk-tilings "$GDN2_WALK_TILINGS"} >"$log" 2>&1
    echo "gdn2_parts exit=$?"; cat "$log"
}
# the two walks alone in every tiling of value block, warps and pipelining depth (seconds of compile each);
# GDN2_WALK_TILINGS: another grid (gdn2_pallas_parts.py --walk-tilings)
task_gdn2_walks() { GDN2_PARTS=walks GDN2_PARTS_LOG=gdn2-walks task_gdn2_parts; }

task_speed_cold() {
    # from empty caches: Triton's (FLA's autotuning with it), TileLang's, JAX's and the references'
    local caches=/tmp/cold-caches
    rm -rf "$caches"
    TRITON_CACHE_DIR=$caches/triton TILELANG_CACHE_DIR=$caches/tilelang DELTABENCH_JAX_CACHE_DIR=$caches/jax \
        DELTABENCH_REFERENCE_CACHE=$caches/references speed cold-gate6 360 --gate-workers 6
    # then warm: the same run again on the caches the cold one filled (issue 16: cold < 240 s, warm < 120 s)
    TRITON_CACHE_DIR=$caches/triton TILELANG_CACHE_DIR=$caches/tilelang DELTABENCH_JAX_CACHE_DIR=$caches/jax \
        DELTABENCH_REFERENCE_CACHE=$caches/references speed warm-gate6 240 --gate-workers 6
    # six places: FLA's chains (one per tuning group), ours, and FlashQLA's kernels listed by a dry run and built
    # side by side beside them, then its four gates from that cache (at 17:04 on 2026-12-01 its four gates side by
    # side, each compiling its ten shapes in a row, ended 8 of 12 gates in 240 s and timed nothing in 360)
}

task_speed_warm() { speed warm 240; }

# the train suite, every impl, four gate processes at once: the run builds FlashQLA's kernels
# itself (a dry run lists them, correctness/compile_ahead.py); issue 16: within 10 minutes. Under the integrity
# defences it reached 600 s with 94 of its 100 jobs done (2026-12-04 18:22): the cap is 900
task_train() {
    run_gated "${TRAIN_CAP:-900}" train 4 --suite train --timeout 300 --impl opengdn_chunkwise --impl triton_chunk_split \
        --impl triton_chunk --impl fla_chunk --impl flash_qla --impl torch_chunk --impl triton_recurrent \
        --impl fla_recurrent --impl jax_chunk --impl opengdn_triton
    PYTHONPATH=$(pypath) python3 benchmarks/job_overhead.py "$dir/train.json" >"$dir/train-overhead.md" 2>&1
    tail -3 "$dir/train-overhead.md"
}

# GDN-2's gated tables on the GPU: ours (jax_chunk, the Pallas kernel for a GPU) beside FLA and torch_chunk, then
# atomic-ops' table layout (its TPU-only rows end unsupported with the reason)
# GDN2_GPU_ARGS: filters for a short session (e.g. "--impl pallas_gpu_chunk --impl fla_chunk"), GDN2_GPU_CAP its cap
# shellcheck disable=SC2086
task_gdn2_gpu() {
    run "${GDN2_GPU_CAP:-600}" gdn2-gpu --suite gdn2-gpu --timeout $((${GDN2_GPU_CAP:-600} - 100)) ${GDN2_GPU_ARGS:-}
}

# sdm's dense limit by parts (1.16 ms against the split GDN forward's 0.265 at 13:56 on 2026-12-01): seconds
task_sdm_dense_parts() {
    stamp sdm_dense_parts
    PYTHONPATH=$(pypath) timeout 180 python3 benchmarks/gpu/sdm_dense_parts.py >"$dir/sdm-dense-parts.log" 2>&1
    echo "sdm_dense_parts exit=$?"; cat "$dir/sdm-dense-parts.log"
}
# sdm's flagship kernels by CUDA time under torch.profiler, the pair work by all pairs and by slot runs (PHASE1
# "pairs" / "sort", each checked against the first), at the defaults (IEEE, 32 columns: 28.2 / 157 ms, 2026-12-02)
task_sdm_profile() {
    stamp sdm_profile
    PYTHONPATH=$(pypath) timeout 300 python3 benchmarks/gpu/sdm_profile.py --block-d 32 --precision ieee \
        --phase1 pairs,sort --no-torch >"$dir/sdm-profile.log" 2>&1
    echo "sdm_profile exit=$?"; tail -40 "$dir/sdm-profile.log" | cut -c1-170
}
task_gdn2_tpu() { run 600 gdn2-tpu --suite gdn2-tpu --timeout 300 --gate-workers 2; }

task_stages() {
    stamp gdn_kernels
    PYTHONPATH=$(pypath) timeout 240 python3 benchmarks/gdn_kernels.py --skip-gate \
        --impls triton_chunk_split,triton_chunk_split_seg4,triton_chunk_split_seg8,triton_chunk_split_seg16,fla_chunk \
        --out "$dir" --tag v6 >"$dir/gdn-kernels.log" 2>&1
    echo "gdn_kernels exit=$?"; grep -E "^\||FAIL|Error" "$dir/gdn-kernels.log" | cut -c1-170 | tail -24
}

# Issue 41's tables: a small LM's whole training step (e2e-h200), packed batches beside their dense forms
# (varlen-h200); every impl's gates side by side (FLA autotunes each new length its gate calls it at). The caps:
# on 2026-12-04 varlen's gates alone ran past 420 s (FLA's autotuning, 62 GiB gates retried alone), decode's took
# 432 s of its 482 (then about 0.7 s a timed job); at 18:32 varlen's 600 s ended in its gates (FLA's packed gdn
# gate 218 s of autotuning, gdn2's 222 s then out of memory beside the others): give it 900. e2e's gates hold 43-49 GiB each at D2048 x 8: two at once fit
# the H200, three ran out and were retried alone; at two their 6 gates take about 9 minutes (FLA's autotuning)
task_e2e() { run "${E2E_CAP:-900}" e2e --suite e2e-h200 --timeout 500 --gate-workers 2; }
task_varlen() { run "${VARLEN_CAP:-900}" varlen --suite varlen-h200 --timeout 500 --gate-workers 4; }

# The decode table (issue 42): FLA's, FlashInfer's and FlashQLA's adapters beside ours, once the calls carrying
# their wheels have staged them (waits up to DECODE_WAIT_S; an impl whose package is missing ends unsupported with
# the reason); DECODE_SHAPES: "B=..,T=.." pairs of the suite's shapes (default B 1, 64, 512 x T 1, 4); DECODE_OPS:
# only these ops (default all); DECODE_GATE_WORKERS (default 6: on an 80 GB H100, 2026-12-05, six gates at B64 and
# B512 ran out of memory beside each other and were retried alone: 48 gates took 575 s)
task_decode() {
    local shapes=() ops=() s
    for _ in $(seq $((${DECODE_WAIT_S:-240} / 5))); do qla_staged && fi_staged && break; sleep 5; done
    for s in ${DECODE_SHAPES:-B=1,T=1 B=1,T=4 B=64,T=1 B=64,T=4 B=512,T=1 B=512,T=4}; do
        shapes+=(--shape "$s,H=16,K=128,V=128")
    done
    for s in ${DECODE_OPS:-}; do ops+=(--op "$s"); done
    run "${DECODE_CAP:-660}" decode --suite decode-h200 --timeout 300 --gate-workers "${DECODE_GATE_WORKERS:-6}" \
        "${shapes[@]}" "${ops[@]}"
}

# The decode launch sweep (benchmarks/gpu/decode_tune.py: every kernel, V block and warp count, each checked, then
# timed by the decode timer), before the decode table so that a launch rule changed from it is judged the same day;
# DECODE_TUNE_OPS: the ops swept in turn (default gdn); DECODE_TUNE_ARGS: decode_tune.py's options (shapes, kernels,
# warps) for each
task_decode_tune() {
    local op
    for op in ${DECODE_TUNE_OPS:-gdn}; do
        stamp "decode_tune $op"
        # shellcheck disable=SC2086  # the options split into words
        PYTHONPATH=$(pypath) timeout "${TUNE_CAP:-420}" python3 benchmarks/gpu/decode_tune.py --op "$op" \
            ${DECODE_TUNE_ARGS:-} >"$dir/decode-tune-$op.log" 2>&1
        echo "decode_tune $op exit=$?"; grep -v "^  B" "$dir/decode-tune-$op.log" | cut -c1-170 | tail -12
    done
}

# Issue 40 on the GPU: each CUDA exploit flagged and the honest kernel not (integrity_h200.py exploits), then the
# integrity records of the session's suites (every job a shipped impl: a failed record is a false flag)
task_integrity_exploits() {
    stamp integrity_exploits
    PYTHONPATH=$(pypath) timeout 300 python3 benchmarks/gpu/integrity_h200.py exploits >"$dir/integrity-exploits.log" 2>&1
    echo "integrity exploits exit=$?"; cut -c1-170 "$dir/integrity-exploits.log"
}
task_integrity_report() {
    local docs=() name
    for name in e2e varlen decode train train-jax sdm-pkg sdm-gpu-dense sdm-gpu-32k sdm-gpu-8k; do [[ -f $dir/$name.json ]] && docs+=("$dir/$name.json"); done
    ((${#docs[@]})) || return 0
    PYTHONPATH=$(pypath) python3 benchmarks/gpu/integrity_h200.py report "${docs[@]}" >"$dir/integrity-report.log" 2>&1
    echo "integrity report exit=$?"; grep -E "FALSE FLAG|false flags|^    " "$dir/integrity-report.log" | cut -c1-170
}

# Issue 39's calibration of `run --repeat auto --base-ref` on the GPU: same-code and planted 5% pairs alternating,
# each an interleaved invocation, until CAL_CAP seconds; the pairs so far are written after each one
task_calibration() {
    stamp calibration
    PYTHONPATH=$(pypath) timeout "${CAL_CAP:-900}" python3 benchmarks/gate_auto_calibration.py \
        --suite benchmarks/gpu/gate-auto-h200.toml --device cuda --same 100 --planted 20 --fraction 0.05 \
        --planted-impl gdn/triton_chunk --planted-mode fwd --dir /tmp/gate-auto --out "$dir/gate-auto-h200.json" \
        >"$dir/gate-auto.log" 2>&1
    echo "calibration exit=$?"; grep -E "^(same|planted) " "$dir/gate-auto.log" | cut -c1-170 | tail -20
}

# Issue 43's bridge on a GPU: the CUDA tests of the torch-facing JAX bridge (no host sync, DLPack streams), then a
# PyTorch user's fwd+bwd through it beside native JAX (the 1.15x target)
task_bridge() {
    stamp bridge
    {
        JAX_PLATFORMS=cuda,cpu PYTHONPATH=$(pypath) timeout 300 python3 -m pytest -q -p no:cacheprovider \
            tests/kernels/test_jax_bridge.py -k cuda
        PYTHONPATH=$(pypath) timeout 300 python3 benchmarks/cpu/bridge_fwd_bwd.py --device cuda \
            --impls gdn2/pallas_gpu_chunk,gdn2/jax_chunk --dtype bf16
    } >"$dir/bridge.log" 2>&1
    echo "bridge exit=$?"; tail -30 "$dir/bridge.log" | cut -c1-170
}

# Issue 40's last H200 jobs under the defences: jax_chunk's train jobs (the 600 s cap of 2026-12-04 18:22 ended
# the train run before six of them), then the sdm-gpu suite's dense and 32K parts and ours' fwd+bwd at the flagship
# (SDM 2.0.0's jobs and our forward there were run that day: run 6f47b8ff)
task_train_jax() { run_gated "${TRAIN_JAX_CAP:-420}" train-jax 2 --suite train --timeout 300 --impl jax_chunk; }
# each part a task of its own, so that a session short of device time queues only some of them
task_sdm_rest_dense() {
    run 420 sdm-gpu-dense --suite sdm-gpu --shape B=1,T=8192,H=2,S=128,D=128,W=128,R=128 \
        --shape B=1,T=8192,H=2,K=128,V=128 --impl triton_chunk --impl triton_chunk_split --timeout 380 --gate-workers 3
}
task_sdm_rest_32k() {
    run 600 sdm-gpu-32k --suite sdm-gpu --shape B=1,T=32768,H=2,S=65536,D=1024,W=64,R=64 --impl triton_chunk \
        --timeout 560
}
task_sdm_rest_8k() {
    run 420 sdm-gpu-8k --suite sdm-gpu --shape B=1,T=8192,H=2,S=65536,D=1024,W=64,R=64 --impl triton_chunk \
        --mode fwd+bwd --timeout 400
}
task_sdm_rest() { task_sdm_rest_dense; task_sdm_rest_32k; task_sdm_rest_8k; }

# The bf16 typical gradient bound against bf16-intermediate kernels' own error (NOTES.md, Open problems): ours with
# and without dk * 1.01 and FLA's, every gradient's error beside its part along the reference, at sdm-gpu's dense gdn
# shape where both failed on 2026-12-05, then at a train shape
task_grad_bias() {
    stamp grad_bias
    local shape
    for shape in B=1,T=8192,H=2,K=128,V=128 B=8,T=4096,H=6,K=128,V=128; do
        PYTHONPATH=$(pypath) timeout 300 python3 benchmarks/gpu/grad_bias.py --impls triton_chunk,fla_chunk \
            --planted triton_chunk --shape "$shape" --seeds 2 --regimes typical,long
    done >"$dir/grad-bias.log" 2>&1
    echo "grad_bias exit=$?"; grep -vE "^  " "$dir/grad-bias.log" | cut -c1-170 | tail -40
}

# Issue 43's Triton GDN-2 / KDA on the GPU: the oracle's fwd+bwd gate (every regime, two seeds) at K = V = 128 over
# ragged chunks and at K != V within one chunk over odd heads, the four gates at once, then the diagnostic beside
# FLA, forward then fwd+bwd, with each launch setting varied alone
task_gdn2_triton() {
    stamp gdn2_triton
    local op shape
    {
        for op in gdn2 kda; do
            for shape in B=2,T=300,H=3,K=128,V=128 B=1,T=40,H=5,K=128,V=64; do
                PYTHONPATH=$(pypath) timeout 240 python3 -m deltabench.cli.app verify --op "$op" --impl triton_chunk \
                    --mode fwd+bwd --device cuda --dtype bf16 --seeds 2 --timeout 220 --shape "$shape" \
                    >"$dir/gdn2-triton-verify-$op-$shape.log" 2>&1 &
            done
        done
        wait
        for op in "$dir"/gdn2-triton-verify-*.log; do echo "== $op"; tail -25 "$op"; done
        PYTHONPATH=$(pypath) timeout "${GDN2_TRITON_CAP:-300}" python3 benchmarks/gpu/gdn2_triton.py --sweep
        echo "gdn2_triton exit=$?"
        PYTHONPATH=$(pypath) timeout "${GDN2_TRITON_CAP:-300}" python3 benchmarks/gpu/gdn2_triton.py --sweep --bwd
        echo "gdn2_triton --bwd exit=$?"
    } >"$dir/gdn2-triton.log" 2>&1
    grep -E "PASS|FAIL|exit=|ms|sweep|Error" "$dir/gdn2-triton.log" | tail -60 | cut -c1-170
}

# take: the next task of the shared queue, removed from it (empty when none is left)
take() {
    local item
    exec 9>"$L/queue.lock"
    flock 9
    item=$(head -1 "$L/queue" 2>/dev/null)
    [[ -n $item ]] && sed -i 1d "$L/queue"
    flock -u 9
    echo "$item"
}

shared() {
    local task
    while task=$(take) && [[ -n $task ]]; do "task_$task"; done
}

lane() {
    local name=$1
    mkdir -p "$L/$name"
    case $name in
        a) export CUDA_VISIBLE_DEVICES=0; lane_a ;;
        b) export CUDA_VISIBLE_DEVICES=1; lane_b ;;
        solo) lane_solo ;;
    esac
    stamp "lane $name done"
    touch "$L/$name/done"
}

call() {
    local wait_s=${1:-560} t_start
    t_start=$(date +%s)
    OUT=${OUT:-/tmp/out}
    mkdir -p "$OUT" "$L/a" "$L/b" "$L/solo"
    bash benchmarks/gpu/install.sh >>"$L/install.log" 2>&1 || { tail -40 "$L/install.log"; exit 1; }
    bash benchmarks/gpu/stage_qla.sh >>"$L/install.log" 2>&1
    bash benchmarks/gpu/stage_flashinfer.sh >>"$L/install.log" 2>&1
    fi_staged && echo "FlashInfer staged"
    # SDM 2.0.0's extensions built in an earlier session, if carried: its parts joined and unpacked
    if compgen -G ".gpucache/sdm-ext/sdm-ext.tgz.part-*" >/dev/null && [[ ! -f $L/a/sdm-pkg-build.done ]]; then
        mkdir -p "$TORCH_EXTENSIONS_DIR" && cat .gpucache/sdm-ext/sdm-ext.tgz.part-* | tar xz -C "$TORCH_EXTENSIONS_DIR" &&
            echo "exit=0 (carried)" >"$L/a/sdm-pkg-build.done"
    fi
    if [[ ! -f $L/started ]] && lanes_ready; then
        touch "$L/started"
        tail -4 "$L/install.log"
        nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$L/gpu.txt"
        bash benchmarks/gpu/autotune_cache.sh restore  # benchmarks/results/fla-autotune.tar.gz
        if (($(nvidia-smi -L | wc -l) > 1)); then lanes="a b"; else lanes=solo; touch "$L/b/done"; fi
        echo "$lanes" >"$L/lanes"
        printf '%s\n' speed_cold gdn2_pallas gdn2_gpu gdn2_tpu stages speed_warm >"$L/queue"
        [[ $lanes == solo ]] && printf '%s\n' gdn2_parts gdn2_pallas sdm_profile gdn2_walks sdm_gpu_parts gdn2_gpu speed_cold stages gdn2_tpu \
            >"$L/queue"
        # LANE_QUEUE="task ...": this session's queue instead (the tasks are the task_* functions above)
        [[ -n ${LANE_QUEUE:-} ]] && printf '%s\n' $LANE_QUEUE >"$L/queue"
        # The lanes run from a copy of the checkout: a call re-sends the checkout while they run, and a module
        # imported mid-copy is missing (2026-12-04: "cannot import name 'memory' from 'deltabench.runners'" in
        # e2e's gates, 40 s into the run, as the next call arrived). The wheels and caches stay where they are.
        mkdir -p "$L/tree" && tar -C . --exclude=./.whl --exclude=./.gpucache -cf - . | tar -C "$L/tree" -xf -
        for name in $lanes; do
            setsid bash "$L/tree/benchmarks/gpu/h200_lanes.sh" lane "$name" >"$L/$name/lane.log" 2>&1 </dev/null &
        done
    fi
    qla_staged && echo "FlashQLA staged" || echo "FlashQLA not staged yet: the lanes start once both halves are"
    while (($(date +%s) - t_start < wait_s)); do
        [[ -f $L/a/done && -f $L/b/done || -f $L/solo/done || ! -f $L/started ]] && break
        sleep 5
    done
    bash benchmarks/gpu/autotune_cache.sh save "$L/autotune" >/dev/null
    for name in $(cat "$L/lanes" 2>/dev/null || echo a b); do
        echo "---- lane $name"
        [[ -f $L/$name/lane.log ]] && grep -vE "^\|" "$L/$name/lane.log" | tail -12 | cut -c1-170
    done
    # not the lanes' copy of the checkout: with it the archive passed the 16 MB a returned file may hold (2026-12-04)
    tar czf "$OUT/lanes.tgz" -C "$L" --exclude=./tree .
    # SDM 2.0.0's built extensions, to carry into a later session (.gpucache/torch_extensions): in parts of at most
    # 15 MB (a file that comes back holds 16 MB), when four parts hold them (64 MiB come back in all, lanes.tgz too)
    if grep -qx "exit=0" "$L"/a/sdm-pkg-build.done 2>/dev/null && [[ ! -f /tmp/sdm-ext.tgz ]]; then
        tar czf /tmp/sdm-ext.tgz -C "$TORCH_EXTENSIONS_DIR" --exclude=lock . &&
            (($(stat -c %s /tmp/sdm-ext.tgz) <= 4 * 15000000)) &&
            split -b 15000000 /tmp/sdm-ext.tgz "$OUT/sdm-ext.tgz.part-"
        ls -l /tmp/sdm-ext.tgz
    fi
    echo "archived $(du -h "$OUT/lanes.tgz" | cut -f1) at $(date -u +%H:%M:%S)"
}

case ${1:-} in
    call) call "${2:-560}" ;;
    lane) lane "${2:?a, b or solo}" ;;
    *) echo "usage: h200_lanes.sh call [WAIT_S] | lane a|b" >&2; exit 2 ;;
esac
