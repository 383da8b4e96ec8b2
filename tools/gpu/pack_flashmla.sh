#!/usr/bin/env bash
# Pack FlashMLA's sources at the last commit we build for Hopper (9241ae3) with the CUTLASS headers it needs,
# for a GPU machine without internet: writes .gpu-deps/flashmla-src.tar.xz (run on a machine with the
# fetched FlashMLA git directory and PyPI access; .gpu-deps/ stays out of the repository).
#
# usage: tools/gpu/pack_flashmla.sh FLASHMLA_GIT_DIR [OUT_DIR]
#   FLASHMLA_GIT_DIR  a clone or bare git dir of deepseek-ai/FlashMLA holding commit 9241ae3   required
#   OUT_DIR           default: .gpu-deps
#   env PYTHON        interpreter that runs pip (default python3)
# CUTLASS: the PyPI package nvidia-cutlass==4.2.0.0 ships cutlass_library/source/include and
# source/tools/util/include; they go where FlashMLA's git submodule would be (csrc/cutlass/).
set -euo pipefail
usage() { sed -n '6,9p' "$0" | sed 's/^# \{0,1\}//' >&2; exit "${1:-2}"; }
case "${1:-}" in -h|--help) usage 0 ;; "") echo "error: no FLASHMLA_GIT_DIR given" >&2; usage ;; esac

COMMIT=9241ae3ef9bac614dd25e45e507e089f888280e0
CUTLASS_PIN=nvidia-cutlass==4.2.0.0
GIT_DIR_IN=$1
OUT_DIR=${2:-.gpu-deps}
PYTHON=${PYTHON:-python3}
OUT="$OUT_DIR/flashmla-src.tar.xz"

git --git-dir="$GIT_DIR_IN" cat-file -e "$COMMIT^{commit}" 2>/dev/null || git -C "$GIT_DIR_IN" cat-file -e "$COMMIT^{commit}" \
  || { echo "error: $GIT_DIR_IN does not hold FlashMLA commit $COMMIT" >&2; exit 1; }

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
SRC="$WORK/flashmla-9241ae3"
mkdir -p "$SRC"
if git --git-dir="$GIT_DIR_IN" rev-parse --git-dir >/dev/null 2>&1; then
  git --git-dir="$GIT_DIR_IN" archive --format=tar "$COMMIT" | tar -x -C "$SRC"
else
  git -C "$GIT_DIR_IN" archive --format=tar "$COMMIT" | tar -x -C "$SRC"
fi
echo "$COMMIT" > "$SRC/FLASHMLA_COMMIT"

"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: -d "$WORK/wheel" "$CUTLASS_PIN"
WHEEL=$(ls "$WORK"/wheel/nvidia_cutlass-*.whl | head -1)
"$PYTHON" - "$WHEEL" "$SRC/csrc/cutlass" <<'PY'
import sys, zipfile, os
wheel, dest = sys.argv[1], sys.argv[2]
# wheel path prefix -> place under csrc/cutlass (FlashMLA's setup.py adds include/ and tools/util/include/)
maps = {"cutlass_library/source/include/": "include/", "cutlass_library/source/tools/util/include/": "tools/util/include/"}
n = 0
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        for src, dst in maps.items():
            if name.startswith(src) and not name.endswith("/"):
                target = os.path.join(dest, dst, name[len(src):])
                os.makedirs(os.path.dirname(target), exist_ok=True)
                with z.open(name) as fi, open(target, "wb") as fo:
                    fo.write(fi.read())
                n += 1
if not os.path.exists(os.path.join(dest, "include/cutlass/cutlass.h")) or not os.path.isdir(os.path.join(dest, "tools/util/include/cutlass")):
    sys.exit(f"error: {wheel} lacks the CUTLASS include trees ({n} files copied)")
print(f"copied {n} CUTLASS header files from {os.path.basename(wheel)}")
PY
echo "$CUTLASS_PIN" > "$SRC/csrc/cutlass/FROM_PYPI"

mkdir -p "$OUT_DIR"
tar -C "$WORK" -cJf "$WORK/out.tar.xz" flashmla-9241ae3
mv "$WORK/out.tar.xz" "$OUT"  # whole file or nothing
SIZE=$(stat -c %s "$OUT")
echo "wrote $OUT ($((SIZE / 1024)) KiB)"
if [ "$SIZE" -gt $((20 * 1024 * 1024)) ]; then echo "error: $OUT is over 20 MiB" >&2; exit 1; fi
