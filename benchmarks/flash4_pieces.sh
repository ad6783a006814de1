#!/usr/bin/env bash
# FlashAttention-4's wheels for the device machine, which has no package index (14.11): they
# are ~100 MB, more than one device call carries beside the tree, so they travel in pieces.
#
#   benchmarks/flash4_pieces.sh build              # on the CPU: .cache/fa4-p1..p3 (40 MB each)
#   bash benchmarks/flash4_pieces.sh keep N        # device call N (carry .cache/fa4-pN):
#                                                  #   the piece kept in /tmp/fa4parts
#   bash benchmarks/flash4_pieces.sh install       # device, after the last piece:
#                                                  #   /tmp/fa4site, and the PYTHONPATH to use
#
# A step then runs with FlashAttention-4 on the path as
#   env PYTHONPATH=/tmp/fa4site:/tmp/fa4site/nvidia_cutlass_dsl/dsl_packages:$PYTHONPATH CMD
# (the second folder is what the cutlass DSL's .pth file would add), and without it as before.
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=(
  "flash-attn-4==4.0.0b36" "nvidia-cutlass-dsl==4.8.1" "nvidia-cutlass-dsl-libs-base==4.8.1"
  "nvidia-cutlass-dsl-libs-core==4.8.1" "nvidia-cutlass-dsl-libs-cu13==4.8.1"
  "quack-kernels==0.6.5" "apache-tvm-ffi==0.1.15.post2" "torch-c-dlpack-ext==0.1.5" "einops==0.8.1"
)
case "${1:-}" in
  build)
    work=$(mktemp -d)
    for wheel in "${WHEELS[@]}"; do  # the device's Python and platform; its torch is there
      python3 -m pip download -q --no-deps --pre --only-binary=:all: --python-version 3.12 \
        --platform manylinux_2_28_x86_64 -d "$work/wheels" "$wheel"
    done
    tar -cf "$work/all.tar" -C "$work/wheels" .
    rm -rf .cache/fa4-p* && split -b 40000000 -d -a 1 "$work/all.tar" "$work/piece."
    n=0
    for piece in "$work"/piece.*; do
      n=$((n + 1)) && mkdir -p ".cache/fa4-p$n" && mv "$piece" ".cache/fa4-p$n/"
    done
    md5sum "$work/all.tar" && rm -rf "$work" && du -sb .cache/fa4-p*
    ;;
  keep)
    mkdir -p /tmp/fa4parts && cp ".cache/fa4-p$2"/piece.* /tmp/fa4parts/ && ls -la /tmp/fa4parts
    ;;
  install)
    cat /tmp/fa4parts/piece.* | md5sum
    rm -rf /tmp/fa4w && mkdir -p /tmp/fa4w && cat /tmp/fa4parts/piece.* | tar -xf - -C /tmp/fa4w
    # pip --target skips a folder that already exists, and the cutlass DSL's wheels share
    # nvidia_cutlass_dsl/: each is unzipped into the same folder instead.
    for wheel in /tmp/fa4w/*.whl; do python3 -m zipfile -e "$wheel" /tmp/fa4site; done
    PYTHONPATH=/tmp/fa4site:/tmp/fa4site/nvidia_cutlass_dsl/dsl_packages python3 -c \
      "import importlib.util as u; print('flash_attn.cute:', u.find_spec('flash_attn.cute') is not None)"
    ;;
  *)
    sed -n 2,14p "$0" && exit 2
    ;;
esac
