#!/usr/bin/env bash
# The README's main job as a new user meets it: a fresh clone, a fresh venv, a fresh home (so the JAX compile
# cache, the gate's reference cache, the ceilings and the database all start empty), then
# `deltabench run --suite smoke` twice: the first run (cold caches) and the second (warm). Prints the commit, the
# load average around each run, each run's wall time and its job counts (the figures the README's timing sentence
# quotes); each run's result document stays under the printed outputs folder, for `deltabench ingest`.
#
#     benchmarks/cpu/first_run.sh [REPO]      # REPO: what to clone (default: this checkout)
#
# Installing takes a few minutes (pip's cache is the user's own, as on a second project); only the two runs are
# timed. Run it on a quiet machine: other work on the cores slows the cold run's compiles about in proportion.
set -euo pipefail

repo=${1:-$(git -C "$(dirname "$0")" rev-parse --show-toplevel)}
work=$(mktemp -d /tmp/deltabench-first-run.XXXXXX)
git clone -q "$repo" "$work/clone"
cd "$work/clone"
echo "commit $(git rev-parse --short HEAD) from $repo; $(nproc) cores; $(python3 --version)"

start=$(date +%s.%N)
python3 -m venv .venv
.venv/bin/pip install -q torch==2.13.0 >"$work/install.log" 2>&1
.venv/bin/pip install -q -e '.[dev]' >>"$work/install.log" 2>&1
echo "install: $(python3 -c "print(f'{$(date +%s.%N) - $start:.1f} s')")"

export HOME="$work/home" XDG_CACHE_HOME="$work/home/.cache" XDG_DATA_HOME="$work/home/.local/share"
mkdir -p "$HOME"
for run in first second; do
    before=$(cut -d' ' -f1-3 /proc/loadavg)
    start=$(date +%s.%N)
    rc=0
    .venv/bin/deltabench run --suite smoke --out "$work/$run.json" >"$work/$run.out" 2>&1 || rc=$?
    wall=$(python3 -c "print(f'{$(date +%s.%N) - $start:.1f}')")
    after=$(cut -d' ' -f1-3 /proc/loadavg)
    echo "$run run: $wall s, exit $rc, $(grep '^jobs:' "$work/$run.out" || echo 'no summary'); load average $before before, $after after"
done
echo "outputs: $work"
