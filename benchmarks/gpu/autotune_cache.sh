#!/usr/bin/env bash
# Keep Triton's autotuning results between device sessions, so that FLA's first call on a fresh GPU machine
# compiles the configs it chose before instead of benchmarking every one of them (35-200 s per new head size).
# Triton stores each autotuner's result as `<kernel>.autotune.json` under a folder named by a hash of Triton's
# version, the GPU target, the kernel's source, the tuning key and the configs, so a saved file is found again only
# by the same kernel on the same GPU and Triton (FLA writes them: its autotuners pass cache_results unless
# FLA_CACHE_RESULTS=0).
#
# The results kept so far are one archive in the repository, benchmarks/results/fla-autotune.tar.gz (FLA 0.6.0's
# choices on the H200, Triton 3.6; a new checkout has no git-ignored folders, and FLA then picks the same configs
# in every session instead of re-deciding per process):
#
#   bash benchmarks/gpu/autotune_cache.sh restore [SRC]  # start of a call: SRC (a folder or .tar.gz; default the
#                                                        # archive above) into Triton's cache
#   bash benchmarks/gpu/autotune_cache.sh save DEST      # end of a call: Triton's results into DEST under $OUT (a
#                                                        # folder, or an archive when DEST ends in .tar.gz or .tgz)
#   bash benchmarks/gpu/autotune_cache.sh merge SRC      # here, after the call: SRC (what save wrote, a folder or
#                                                        # archive) into the archive above; then commit the archive
#
# `merge` keeps every file of the archive and adds SRC's (a file at the same path, the same kernel and key, is
# replaced by SRC's), and writes the archive byte for byte the same for the same files (sorted, no owners or
# times), so that git sees a change only when a result changed.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
ARCHIVE=$ROOT/benchmarks/results/fla-autotune.tar.gz
cache=${TRITON_CACHE_DIR:-$HOME/.triton/cache}
action=${1:?save, restore or merge}

# unpack SRC DIR: the *.autotune.json files of SRC (a folder or a .tar.gz/.tgz archive) into DIR, keeping their paths
unpack() {
    local src=$1 dir=$2
    mkdir -p "$dir"
    if [[ -d $src ]]; then
        (cd "$src" && find . -name '*.autotune.json' -print0 | xargs -0 -r cp --parents -t "$dir")
    elif [[ -f $src ]]; then
        tar xzf "$src" -C "$dir" --wildcards '*.autotune.json'
    else
        echo "autotune_cache.sh: $src is neither a folder nor an archive" >&2
        exit 2
    fi
}

# pack DIR FILE: DIR's *.autotune.json files as a reproducible .tar.gz
pack() {
    local dir=$1 file=$2
    (cd "$dir" && find . -name '*.autotune.json' | LC_ALL=C sort |
        tar --owner=0 --group=0 --numeric-owner --mtime=@0 --no-recursion -cf - -T -) | gzip -n -9 >"$file"
}

count() { find "$1" -name '*.autotune.json' | wc -l; }

case $action in
    save)
        dest=${2:?destination folder or .tar.gz}
        tmp=$(mktemp -d)
        [[ -d $cache ]] && unpack "$cache" "$tmp"
        if [[ $dest == *.tar.gz || $dest == *.tgz ]]; then
            mkdir -p "$(dirname "$dest")"
            pack "$tmp" "$dest"
        else
            unpack "$tmp" "$dest"
        fi
        echo "autotune results saved: $(count "$tmp") files in $dest"
        rm -rf "$tmp"
        ;;
    restore)
        src=${2:-$ARCHIVE}
        unpack "$src" "$cache"
        echo "autotune results restored: $(count "$cache") files in $cache (from $src)"
        ;;
    merge)
        src=${2:?a folder or archive that save wrote}
        tmp=$(mktemp -d)
        [[ -f $ARCHIVE ]] && unpack "$ARCHIVE" "$tmp"
        before=$(count "$tmp")
        unpack "$src" "$tmp"
        pack "$tmp" "$ARCHIVE.new" && mv "$ARCHIVE.new" "$ARCHIVE"
        echo "autotune archive: $before files before, $(count "$tmp") after ($ARCHIVE)"
        rm -rf "$tmp"
        ;;
    *) echo "autotune_cache.sh: unknown action $action (save, restore or merge)" >&2; exit 2 ;;
esac
