#!/usr/bin/env bash
# Stage the flashinfer set on the GPU machine, one part a call (.gpucache/fi1, fi2, ... from `fetch_wheels.sh
# flashinfer`): each call's part is kept in /tmp/fi-parts; once every part its MANIFEST counts is there, the tar is
# joined, checked against the MANIFEST's sha256, and its wheels are installed into a site folder of their own,
# /tmp/site-fi. Then it prints the PYTHONPATH entries to add: that folder, and CuTe DSL's package folder
# (nvidia-cutlass-dsl puts it on sys.path from a .pth file, which a --target folder on PYTHONPATH never runs).
# Until then it prints nothing (its progress goes to stderr). The machine must stay warm between the calls.
#
#   fi=$(bash benchmarks/gpu/stage_flashinfer.sh) && export PYTHONPATH=/tmp/site${fi:+:$fi}
set -euo pipefail
cd "$(dirname "$0")/../.."
SITE=${DELTABENCH_FI_SITE:-/tmp/site-fi}
PARTS=${DELTABENCH_FI_PARTS:-/tmp/fi-parts}
mkdir -p "$PARTS"
paths() { echo "$SITE:$SITE/nvidia_cutlass_dsl/dsl_packages"; }

shopt -s nullglob
for dir in .gpucache/fi[0-9]*/; do
    if [[ -f $PARTS/MANIFEST ]] && ! cmp -s "$dir/MANIFEST" "$PARTS/MANIFEST"; then
        echo "flashinfer: $dir comes from another fetch than the parts kept in $PARTS (MANIFEST differs)" >&2
        exit 1
    fi
    cp "$dir"MANIFEST "$dir"flashinfer.tar.part* "$PARTS/"
    echo "flashinfer: kept $(basename "$dir")" >&2
done
if [[ -f $SITE/.deltabench-installed ]]; then
    paths
    exit 0
fi
if [[ ! -f $PARTS/MANIFEST ]]; then
    echo "flashinfer: no part carried yet" >&2
    exit 0
fi
want=$(awk '$1 == "parts" {print $2}' "$PARTS/MANIFEST")
sum=$(awk '$1 == "sha256" {print $2}' "$PARTS/MANIFEST")
parts=("$PARTS"/flashinfer.tar.part*)
if ((${#parts[@]} < want)); then
    echo "flashinfer: ${#parts[@]} of $want parts here; installed once all are" >&2
    exit 0
fi
cat "${parts[@]}" >"$PARTS/flashinfer.tar"
if ! echo "$sum  $PARTS/flashinfer.tar" | sha256sum -c --quiet - >&2; then
    echo "flashinfer: the joined parts do not match the MANIFEST's sha256" >&2
    exit 1
fi
mkdir -p "$PARTS/wheels"
tar -C "$PARTS/wheels" -xf "$PARTS/flashinfer.tar"
rm -f "$PARTS/flashinfer.tar"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
    "$PARTS"/wheels/*.whl
touch "$SITE/.deltabench-installed"
echo "flashinfer: installed $(ls "$PARTS"/wheels | wc -l) wheels in $SITE" >&2
paths
