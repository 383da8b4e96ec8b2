#!/usr/bin/env bash
# Build FlashMLA (commit 9241ae3, sm_90a only) on the GPU machine from the tarball made by pack_flashmla.sh,
# in place, and print the PYTHONPATH that makes `import flash_mla` work. Idempotent: an existing build is kept.
#
# usage: tools/gpu/build_flashmla.sh [TARBALL] [BUILD_ROOT]
#   TARBALL     default: .gpu-deps/flashmla-src.tar.xz
#   BUILD_ROOT  default: .gpu-deps (the tree lands in BUILD_ROOT/flashmla-9241ae3)
# then:  export PYTHONPATH=$PWD/.gpu-deps/flashmla-9241ae3${PYTHONPATH:+:$PYTHONPATH}
#        (or: source .gpu-deps/flashmla.env)
# Needs: nvcc (CUDA >= 12.8), torch with CUDA, setuptools; ninja for a parallel build (MAX_JOBS).
# CUDA 13 moved libcu++ under include/cccl, which g++ needs for csrc/api/api.cpp: hence CPLUS_INCLUDE_PATH.
set -euo pipefail
usage() { sed -n '5,9p' "$0" | sed 's/^# \{0,1\}//' >&2; exit "${1:-2}"; }
case "${1:-}" in -h|--help) usage 0 ;; esac

TARBALL=${1:-.gpu-deps/flashmla-src.tar.xz}
ROOT=${2:-.gpu-deps}
PYTHON=${PYTHON:-python3}
SRC="$ROOT/flashmla-9241ae3"
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}

[ -f "$TARBALL" ] || { echo "error: $TARBALL not found (make it with tools/gpu/pack_flashmla.sh)" >&2; usage 1; }
if ! ls "$SRC"/flash_mla/cuda*.so >/dev/null 2>&1; then
  rm -rf "$SRC"
  mkdir -p "$ROOT"
  tar -xJf "$TARBALL" -C "$ROOT"
  CCCL="$CUDA_HOME/targets/x86_64-linux/include/cccl"
  if [ -d "$CCCL" ]; then export CPLUS_INCLUDE_PATH="$CCCL${CPLUS_INCLUDE_PATH:+:$CPLUS_INCLUDE_PATH}"; fi
  "$PYTHON" -c "import ninja" 2>/dev/null || command -v ninja >/dev/null \
    || echo "warning: ninja not found: torch builds the extension serially (slow)" >&2
  start=$(date +%s)
  (cd "$SRC" && FLASH_MLA_DISABLE_SM100=1 MAX_JOBS=${MAX_JOBS:-16} "$PYTHON" setup.py build_ext --inplace) \
    > "$ROOT/flashmla-build.log" 2>&1 || { tail -40 "$ROOT/flashmla-build.log" >&2; echo "error: build failed (log: $ROOT/flashmla-build.log)" >&2; exit 1; }
  echo "built FlashMLA $(cat "$SRC/FLASHMLA_COMMIT") in $(( $(date +%s) - start )) s (log: $ROOT/flashmla-build.log)"
fi
ABS=$(cd "$SRC" && pwd)
echo "export PYTHONPATH=$ABS\${PYTHONPATH:+:\$PYTHONPATH}" > "$ROOT/flashmla.env"
PYTHONPATH="$ABS${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -c "import flash_mla, flash_mla.cuda; print('flash_mla importable from', flash_mla.__file__)"
echo "export PYTHONPATH=$ABS\${PYTHONPATH:+:\$PYTHONPATH}"
