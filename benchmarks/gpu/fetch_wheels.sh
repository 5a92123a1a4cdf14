#!/usr/bin/env bash
# Download, here (where PyPI is reachable), the wheels the GPU machine lacks into .whl/<set>/ of the checkout.
# The GPU machine runs CPython 3.12 on x86-64 and reaches no registry, so every wheel is fetched for that target,
# without dependencies, and each missing dependency is named explicitly. Idempotent: pip skips files it has.
#
#   bash benchmarks/gpu/fetch_wheels.sh [SET ...]  # sets: base fla qla1 qla2 opengdn atomic sdm flashinfer
#                                                   # (default: all but flashinfer)
#
# .whl/ is git-ignored (.gitignore and .git/info/exclude); it travels to the GPU machine only when a call names
# the set folders in `carry`. FlashQLA's two halves, qla1 and qla2, go to .gpucache/<set>/ instead (git-ignored
# too): they travel in two separate calls and are staged apart by stage_qla.sh, not by install.sh (README.md here).
# The flashinfer set (about 155 MiB, two of its wheels near or over a call's 64 MiB on their own) is packed into one
# tar and split into parts of at most FI_PART_MIB (52) MiB, .gpucache/fi1, fi2, ...: one call carries each part, and
# stage_flashinfer.sh joins and installs them on the GPU machine once all are there.
set -euo pipefail
cd "$(dirname "$0")/../.."

declare -A SETS=(
    # deltabench's core imports pydantic, which the image lacks (torch, numpy, typer, rich are there);
    # pydantic 2.14 needs typing-extensions >= 4.16, newer than the image may hold.
    [base]="pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0"
    # FLA: fla-core holds the ops (needs einops: in the image); flash-linear-attention adds layers/models
    # (needs transformers >= 5.6.2: the image has 5.17).
    [fla]="fla-core==0.6.0 flash-linear-attention==0.6.0"
    # FlashQLA and its TileLang (~50 MB together) ...
    [qla1]="flash-qla==0.1.3 tilelang==0.1.15"
    # ... and TileLang's dependencies that the image lacks (cloudpickle, ml-dtypes, psutil, tqdm are there).
    [qla2]="z3-solver==4.15.4.0 apache-tvm-ffi==0.1.12 torch-c-dlpack-ext==0.1.5"
    [opengdn]="opengdn==0.1.0"
    # atomic-ops' JAX reference paths (impl atomic_ops_wy; its fused kernel needs a TPU): pure Python, on the
    # image's JAX.
    [atomic]="atomic-ops==0.2.0"
    # SDM 2.0.0's own op (impl sdm_pkg_chunk). It pins torch 2.13.0 and triton 3.7.1; install.sh installs it without
    # its dependencies, on the image's torch (einops: in the image; ninja: pip's, for its CUDA extensions' build).
    [sdm]="sparse-delta-memory==2.0.0 ninja==1.13.2"
    [cupti]="cupti-python==13.0.1 pyelftools==0.33"
    # FlashInfer's GDN decode kernels (impls flashinfer_decode, flashinfer_mtp) are CuTe DSL: the wheel (62 MB), CuTe
    # DSL (nvidia-cutlass-dsl, its core and base halves, and its CUDA 13 compiler library, 92 MB) and tvm-ffi and
    # cuda-tile, which flashinfer imports. The image has its other imports: cuda-bindings, nvidia-ml-py, requests,
    # tabulate, click, filelock, einops, ninja, numpy, packaging, tqdm, torch (flashinfer's METADATA also names
    # nccl4py, nccl-extensions and nvidia-cudnn-frontend, imported only by its collective and cuDNN paths).
    [flashinfer]="flashinfer-python==0.7.2.post1 nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1
        nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1 apache-tvm-ffi==0.1.12 cuda-tile==1.7.0"
)
FI_PART_MIB=${FI_PART_MIB:-52}
PLATFORMS=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64
    manylinux2014_x86_64 manylinux1_x86_64 any)

# Pack the wheels of folder $1 into one tar split into parts of at most FI_PART_MIB MiB, part i under .gpucache/fi<i>/
# with the manifest (part count and the tar's sha256) beside it; earlier parts are removed first.
split_parts() {
    local dir=$1 tmp
    tmp=$(mktemp -d)
    tar -C "$dir" -cf "$tmp/flashinfer.tar" $(cd "$dir" && ls ./*.whl)
    split -b "${FI_PART_MIB}M" -d -a 2 "$tmp/flashinfer.tar" "$tmp/flashinfer.tar.part"
    local parts=("$tmp"/flashinfer.tar.part*) sum i=1
    sum=$(sha256sum "$tmp/flashinfer.tar" | cut -d' ' -f1)
    rm -rf .gpucache/fi[0-9]*
    for part in "${parts[@]}"; do
        mkdir -p ".gpucache/fi$i"
        mv "$part" ".gpucache/fi$i/"
        printf 'parts %d\nsha256 %s\n' "${#parts[@]}" "$sum" >".gpucache/fi$i/MANIFEST"
        echo "flashinfer part $i of ${#parts[@]}: $(du -b ".gpucache/fi$i" | cut -f1) bytes, in .gpucache/fi$i"
        i=$((i + 1))
    done
    rm -rf "$tmp"
}

sets=("$@")
[[ ${#sets[@]} -gt 0 ]] || sets=(base fla qla1 qla2 opengdn atomic sdm)
for set in "${sets[@]}"; do
    [[ -n ${SETS[$set]:-} ]] || { echo "unknown set '$set' (sets: ${!SETS[*]})" >&2; exit 2; }
    dir=.whl/$set
    [[ $set == qla* || $set == flashinfer ]] && dir=.gpucache/$set
    mkdir -p "$dir"
    # shellcheck disable=SC2086  # the set's requirements are meant to split into words
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        "${PLATFORMS[@]/#/--platform=}" -d "$dir" ${SETS[$set]}
    echo "$set: $(du -sh "$dir" | cut -f1) in $(find "$dir" -name '*.whl' | wc -l) wheels, in $dir"
    if [[ $set == flashinfer ]]; then split_parts "$dir"; fi
done
