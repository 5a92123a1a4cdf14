#!/usr/bin/env bash
# Install, on the GPU machine, the wheel sets carried under .whl/ into a private site folder, then deltabench itself.
#
#   bash benchmarks/gpu/install.sh && export PYTHONPATH=/tmp/site
#
# Each set present under .whl/ (base first, then the others in name order) is installed with
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/<set>/*.whl
# and stamped with the list of its wheel names, so a later call (the machine stays warm between calls, /tmp/site with
# it) skips what is already there. FlashQLA's two halves live under .gpucache/ and are staged by stage_qla.sh (README.md).
# deltabench is then installed editable (`pip install --no-deps --no-build-isolation -e .`), unless this checkout is
# already what `import deltabench.harness` finds; if pip cannot do it, a symlink tree under the site folder serves.
# Environment: DELTABENCH_SITE (default /tmp/site), DELTABENCH_WHEELS (default .whl).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
SITE=${DELTABENCH_SITE:-/tmp/site}
WHEELS=${DELTABENCH_WHEELS:-.whl}
PY=${PYTHON:-python3}
mkdir -p "$SITE/.deltabench-sets"
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"

install_set() {
    local set=$1 dir=$WHEELS/$1 stamp=$SITE/.deltabench-sets/$1 wheels names
    shopt -s nullglob
    wheels=("$dir"/*.whl)
    shopt -u nullglob
    if [[ ${#wheels[@]} -eq 0 ]]; then
        return 0
    fi
    names=$(printf '%s\n' "${wheels[@]##*/}" | sort)
    if [[ -f $stamp && "$(cat "$stamp")" == "$names" ]]; then
        echo "wheels: $set already installed in $SITE"
        return 0
    fi
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "${wheels[@]}"
    printf '%s\n' "$names" >"$stamp"
    echo "wheels: $set installed in $SITE (${#wheels[@]} wheels)"
}

if [[ -d $WHEELS ]]; then
    install_set base
    for dir in "$WHEELS"/*/; do
        set=$(basename "$dir")
        [[ $set == base ]] || install_set "$set"
    done
else
    echo "wheels: no $WHEELS folder here (carry .whl/<set> to bring wheels)"
fi

deltabench_here() {
    "$PY" - "$ROOT" <<'PY' 2>/dev/null
import sys
from pathlib import Path

import deltabench.harness as h

sys.exit(0 if Path(h.__file__).resolve().is_relative_to(Path(sys.argv[1]).resolve()) else 1)
PY
}

if deltabench_here; then
    echo "deltabench: already importable from $ROOT"
elif "$PY" -m pip install -q --no-deps --no-build-isolation -e "$ROOT"; then
    echo "deltabench: installed editable from $ROOT"
else
    # Fallback: the namespace `deltabench` as a folder of links to the top-level layers (no __init__.py needed).
    echo "deltabench: pip could not install it editable; linking the layers under $SITE/deltabench instead"
    mkdir -p "$SITE/deltabench"
    for layer in references kernels harness runners db web; do
        [[ -d $ROOT/$layer ]] && ln -sfn "$ROOT/$layer" "$SITE/deltabench/$layer"
    done
fi
deltabench_here || { echo "deltabench: import check failed" >&2; exit 1; }

"$PY" - <<'PY'
"""Print what this machine now has: Python, the GPU, and the versions deltabench's runs depend on."""
import importlib.metadata as md
import importlib.util
import platform

import torch

gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device"
cap = "sm_%d%d" % torch.cuda.get_device_capability(0) if torch.cuda.is_available() else "-"
print(f"python {platform.python_version()}  torch {torch.__version__}  gpu {gpu} ({cap})")
names = ["triton", "jax", "pydantic", "pydantic-core", "typing-extensions", "fla-core", "flash-linear-attention",
         "flash-qla", "tilelang", "apache-tvm-ffi", "z3-solver", "opengdn", "deltabench"]
versions = []
for name in names:
    try:
        versions.append(f"{name} {md.version(name)}")
    except md.PackageNotFoundError:
        versions.append(f"{name} -")
print("  ".join(versions))
for mod in ("fla", "flash_qla", "tilelang", "opengdn"):
    if importlib.util.find_spec(mod) is None:
        print(f"adapter package {mod}: not installed (its deltabench impls are listed as unavailable)")
PY
