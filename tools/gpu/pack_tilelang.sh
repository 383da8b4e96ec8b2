#!/usr/bin/env bash
# Pack TileLang 0.1.15 and what it needs beyond torch/numpy for the offline GPU machine, small enough to travel
# beside the working tree (the device call carries at most 64 MiB): writes OUT_DIR/*.tar.xz for
# `tools/gpu/wheels.sh unpack` (run_gpu_suite.sh unpacks them itself). The z3-solver wheel ships libz3.so and
# libz3.so.4.15 as two full 22 MB copies (TileLang's compiler library links the versioned name); the
# unversioned one becomes a symlink, which halves that package (51 -> about 40 MB in all).
#
# usage: tools/gpu/pack_tilelang.sh [OUT_DIR]      OUT_DIR default: .gpu-deps/tilelang
# env:   WHEEL_PYTHON, PYTHON as for tools/gpu/wheels.sh (downloads from PyPI)
set -euo pipefail
case "${1:-}" in -h|--help) sed -n '8,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
OUT=${1:-.gpu-deps/tilelang}
"$(dirname "$0")/wheels.sh" pack "$OUT" tilelang==0.1.15 'apache-tvm-ffi>=0.1.11,<0.1.13' torch-c-dlpack-ext \
  'z3-solver>=4.13.0,<4.15.5'
for archive in "$OUT"/z3_solver-*.tar.xz; do
  tmp=$(mktemp -d)
  tar -xJf "$archive" -C "$tmp"
  for lib in "$tmp"/z3/lib/libz3.so.*; do
    if [ -f "$tmp/z3/lib/libz3.so" ] && cmp -s "$lib" "$tmp/z3/lib/libz3.so"; then
      ln -sf "$(basename "$lib")" "$tmp/z3/lib/libz3.so"
    fi
  done
  tar -C "$tmp" -cf - . | xz -T0 -9 > "$archive"
  rm -rf "$tmp"
  echo "deduplicated $(basename "$archive") ($(du -h "$archive" | cut -f1))"
done
du -sh "$OUT"
