#!/usr/bin/env bash
# Carry pure-pip dependencies to a GPU machine without internet: download wheels here, unpack them there.
#
# usage: tools/gpu/wheels.sh pack DIR SPEC...     download each SPEC's wheel (no dependencies: list every package
#                                                 needed) and store it unzipped as DIR/<wheel name>.tar.xz
#        tools/gpu/wheels.sh unpack DIR TARGET    extract every DIR/*.tar.xz into TARGET; then put TARGET on
#                                                 PYTHONPATH
# env:   WHEEL_PYTHON  CPython version of the GPU machine (default 3.12); wheels are taken for x86-64 manylinux
#        PYTHON        interpreter that runs pip here (default python3)
# A wheel is a zip of what site-packages holds, so extracting one is an install (without its entry points).
set -euo pipefail

usage() { sed -n '4,9p' "$0" | sed 's/^# \{0,1\}//' >&2; exit "${1:-2}"; }

cmd=${1:-}
case "$cmd" in
  pack)
    [ $# -ge 3 ] || usage
    out=$2; shift 2
    py=${WHEEL_PYTHON:-3.12}
    abi="cp${py/./}"
    platforms=(--platform any --platform manylinux2014_x86_64)
    for minor in $(seq 17 39); do platforms+=(--platform "manylinux_2_${minor}_x86_64"); done
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    for spec in "$@"; do
      "${PYTHON:-python3}" -m pip download --quiet --no-deps --only-binary=:all: --implementation cp \
        --python-version "$py" --abi "$abi" --abi abi3 --abi none "${platforms[@]}" -d "$tmp/wheels" "$spec"
    done
    mkdir -p "$out"
    for wheel in "$tmp"/wheels/*.whl; do
      name=$(basename "$wheel" .whl)
      rm -rf "$tmp/tree" && mkdir -p "$tmp/tree"
      "${PYTHON:-python3}" -m zipfile -e "$wheel" "$tmp/tree"
      tar -C "$tmp/tree" -cf - . | xz -T0 -6 > "$tmp/out.tar.xz"
      mv "$tmp/out.tar.xz" "$out/$name.tar.xz"  # whole file or nothing
      echo "packed $name ($(du -h "$out/$name.tar.xz" | cut -f1))"
    done
    ;;
  unpack)
    [ $# -eq 3 ] || usage
    dir=$2 target=$3
    archives=("$dir"/*.tar.xz)
    if [ ! -f "${archives[0]}" ]; then
      echo "error: no *.tar.xz in $dir (make them with: tools/gpu/wheels.sh pack)" >&2
      exit 1
    fi
    mkdir -p "$target"
    for a in "${archives[@]}"; do tar -xJf "$a" -C "$target"; done
    echo "unpacked ${#archives[@]} packages into $target (export PYTHONPATH=$(cd "$target" && pwd):\$PYTHONPATH)"
    ;;
  -h|--help) usage 0 ;;
  *) usage ;;
esac
