#!/usr/bin/env bash
# Build DeepGEMM on the GPU machine (no internet) from the tarball made by pack_deepgemm.sh, in place, and
# write an env file that makes `import deep_gemm` and its runtime JIT work. Idempotent: a built tree is kept.
#
# usage: tools/gpu/build_deepgemm.sh [TARBALL] [BUILD_ROOT]
#   TARBALL     default: .gpu-deps/deepgemm-src.tar.xz
#   BUILD_ROOT  default: .gpu-deps (the tree lands in BUILD_ROOT/deepgemm-54e2261)
# then:  source .gpu-deps/deepgemm.env
# Needs: torch with CUDA, nvcc >= 12.3 (12.9+ for best code; CUDA 13 works), setuptools, a C++ compiler.
#
# What DeepGEMM needs (its setup.py, develop.sh and README): only csrc/python_api.cpp is compiled at install
# (host C++ against torch, CUDA runtime/NVRTC, CUTLASS and fmt headers); every GPU kernel is compiled on first
# use by its JIT, which runs $CUDA_HOME/bin/nvcc (or DG_JIT_NVCC_COMPILER) with -I deep_gemm/include, so the
# CuTe/CUTLASS headers must sit in deep_gemm/include/{cute,cutlass} (develop.sh links them there). Compiled
# kernels are cached in DG_JIT_CACHE_DIR (default ~/.deep_gemm; set below so a warm machine keeps them).
# CUDA 13 moved libcu++ (cuda/std/...) under targets/x86_64-linux/include/cccl: added to CPLUS_INCLUDE_PATH
# for the host compiler (setup.py also passes $CUDA_HOME/include/cccl).
set -euo pipefail
usage() { sed -n '5,8p' "$0" | sed 's/^# \{0,1\}//' >&2; exit "${1:-2}"; }
case "${1:-}" in -h|--help) usage 0 ;; esac

TARBALL=${1:-.gpu-deps/deepgemm-src.tar.xz}
ROOT=${2:-.gpu-deps}
PYTHON=${PYTHON:-python3}
NAME=deepgemm-54e2261
SRC="$ROOT/$NAME"
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
CCCL="$CUDA_HOME/targets/x86_64-linux/include/cccl"
[ -d "$CCCL" ] || CCCL="$CUDA_HOME/include/cccl"

[ -f "$TARBALL" ] || { echo "error: $TARBALL not found (make it with tools/gpu/pack_deepgemm.sh)" >&2; usage 1; }
[ -x "$CUDA_HOME/bin/nvcc" ] || { echo "error: no nvcc at $CUDA_HOME/bin/nvcc (set CUDA_HOME)" >&2; exit 1; }
if [ -d "$CCCL" ]; then export CPLUS_INCLUDE_PATH="$CCCL${CPLUS_INCLUDE_PATH:+:$CPLUS_INCLUDE_PATH}"; fi

if ! ls "$SRC"/deep_gemm/_C*.so >/dev/null 2>&1; then
  rm -rf "$SRC"
  mkdir -p "$ROOT"
  tar -xJf "$TARBALL" -C "$ROOT"
  # The JIT's include root: CuTe/CUTLASS beside deep_gemm's own headers (copies: the tree may be moved).
  cp -r "$SRC/third-party/cutlass/include/cute" "$SRC/third-party/cutlass/include/cutlass" "$SRC/deep_gemm/include/"
  # setup.py imports wheel.bdist_wheel at module level; without the wheel package a stand-in class will do.
  SHIM="$ROOT/deepgemm-build-shim"
  if ! "$PYTHON" -c "import wheel.bdist_wheel" 2>/dev/null; then
    mkdir -p "$SHIM/wheel"
    : > "$SHIM/wheel/__init__.py"
    # Only subclassed for the bdist_wheel command, which this build never runs.
    echo "from setuptools import Command as bdist_wheel  # noqa: F401" > "$SHIM/wheel/bdist_wheel.py"
    export PYTHONPATH="$(cd "$SHIM" && pwd)${PYTHONPATH:+:$PYTHONPATH}"
  fi
  start=$(date +%s)
  # DG_USE_LOCAL_VERSION=0: no `git status` (the tree is an archive); build_ext --inplace puts deep_gemm/_C*.so
  # next to the package, as develop.sh does with its symlink.
  (cd "$SRC" && DG_USE_LOCAL_VERSION=0 MAX_JOBS=${MAX_JOBS:-16} "$PYTHON" setup.py build_ext --inplace) \
    > "$ROOT/deepgemm-build.log" 2>&1 \
    || { tail -40 "$ROOT/deepgemm-build.log" >&2; echo "error: build failed (log: $ROOT/deepgemm-build.log)" >&2; exit 1; }
  echo "built DeepGEMM $(cat "$SRC/DEEPGEMM_COMMIT") in $(( $(date +%s) - start )) s (log: $ROOT/deepgemm-build.log)"
fi
ABS=$(cd "$SRC" && pwd)
mkdir -p "$ROOT/deepgemm-jit"
JIT=$(cd "$ROOT/deepgemm-jit" && pwd)
{
  echo "export PYTHONPATH=$ABS\${PYTHONPATH:+:\$PYTHONPATH}"
  echo "export CUDA_HOME=$CUDA_HOME"
  echo "export DG_JIT_CACHE_DIR=$JIT"
  if [ -d "$CCCL" ]; then echo "export CPLUS_INCLUDE_PATH=$CCCL\${CPLUS_INCLUDE_PATH:+:\$CPLUS_INCLUDE_PATH}"; fi
} > "$ROOT/deepgemm.env"
# shellcheck disable=SC1091
source "$ROOT/deepgemm.env"
"$PYTHON" -c "import deep_gemm; print('deep_gemm', deep_gemm.__version__, 'importable from', deep_gemm.__file__)"
echo "source $ROOT/deepgemm.env"
