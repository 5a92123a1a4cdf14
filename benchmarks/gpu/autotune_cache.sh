#!/usr/bin/env bash
# Keep Triton's autotuning results between device sessions, so that FLA's first call on a fresh GPU machine
# compiles the configs it chose before instead of benchmarking every one of them (35-200 s per new head size;
# benchmarks/NOTES.md, session 5). Triton stores each autotuner's result as `<kernel>.autotune.json` under a
# folder named by a hash of Triton's version, the GPU target, the kernel's source, the tuning key and the
# configs, so a saved file is found again only by the same kernel on the same GPU and Triton (FLA writes them:
# its autotuners pass cache_results unless FLA_CACHE_RESULTS=0).
#
#   bash benchmarks/gpu/autotune_cache.sh save DIR      # at the end of a call: DIR under $OUT comes back here
#   bash benchmarks/gpu/autotune_cache.sh restore DIR   # at the start of a call: DIR carried from here
#
# Here, merge what came back into benchmarks/h200/fla-autotune/ (tracked: a new checkout has no git-ignored folders,
# and FLA then picks the same configs in every session instead of re-deciding per process) and commit it.
set -euo pipefail
action=${1:?save or restore}
dir=$(mkdir -p "${2:?folder}" && cd "$2" && pwd)
cache=${TRITON_CACHE_DIR:-$HOME/.triton/cache}
case $action in
    save)
        (cd "$cache" 2>/dev/null && find . -name '*.autotune.json' -print0 | xargs -0 -r cp --parents -t "$dir")
        echo "autotune results saved: $(find "$dir" -name '*.autotune.json' | wc -l) files in $dir"
        ;;
    restore)
        mkdir -p "$cache"
        (cd "$dir" && find . -name '*.autotune.json' -print0 | xargs -0 -r cp --parents -t "$cache")
        echo "autotune results restored: $(find "$dir" -name '*.autotune.json' | wc -l) files into $cache"
        ;;
    *) echo "autotune_cache.sh: unknown action $action (save or restore)" >&2; exit 2 ;;
esac
