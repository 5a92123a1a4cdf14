#!/usr/bin/env bash
# Stage whichever halves of FlashQLA's wheels this call carries (.gpucache/qla1, .gpucache/qla2) into their own site
# folder, /tmp/site-qla (README.md here: a half-installed TileLang on the path breaks FLA's import, so that folder
# goes on PYTHONPATH only once both halves are in it). Prints the folder to add to PYTHONPATH when both are there.
#
#   qla=$(bash benchmarks/gpu/stage_qla.sh) && export PYTHONPATH=/tmp/site${qla:+:$qla}
set -euo pipefail
cd "$(dirname "$0")/../.."
SITE=${DELTABENCH_QLA_SITE:-/tmp/site-qla}
mkdir -p "$SITE/.deltabench-sets"
for half in qla1 qla2; do
    if [[ -d .gpucache/$half && ! -f $SITE/.deltabench-sets/$half ]]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
            .gpucache/$half/*.whl
        touch "$SITE/.deltabench-sets/$half"
        echo "staged $half in $SITE" >&2
    fi
done
if [[ -f $SITE/.deltabench-sets/qla1 && -f $SITE/.deltabench-sets/qla2 ]]; then
    echo "$SITE"
else
    echo "FlashQLA: $(ls "$SITE/.deltabench-sets" | tr '\n' ' ')staged; not on the path until both halves are" >&2
fi
