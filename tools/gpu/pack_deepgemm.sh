#!/usr/bin/env bash
# Pack DeepGEMM's sources at a pinned commit with the third-party headers its build and runtime JIT need
# (CUTLASS/CuTe and fmt, git submodules that a source snapshot lacks), for a GPU machine without internet.
# Writes OUT_DIR/deepgemm-src.tar.xz; run where the fetched git directories (and, as a fallback, PyPI) are.
#
# usage: DEEPGEMM_GIT=DIR FMT_GIT=DIR [CUTLASS_GIT=DIR] tools/gpu/pack_deepgemm.sh [OUT_DIR]
#   OUT_DIR       default: .gpu-deps
#   DEEPGEMM_GIT  git dir (bare clone, or a clone's .git) of deepseek-ai/DeepGEMM      required
#   FMT_GIT       git dir of fmtlib/fmt                                                 required
#   CUTLASS_GIT   git dir of NVIDIA/cutlass                                             optional
#   PYTHON        interpreter for the PyPI fallback (default python3)
# The CUTLASS and fmt commits are the submodule pins of the DeepGEMM commit. Without a CUTLASS git dir the
# headers come from the PyPI package nvidia-cutlass==4.2.0.0 (cutlass_library/source/include), which matches
# CUTLASS 4.2 as pinned; fmt has no such package, so its git dir is required.
set -euo pipefail
usage() { sed -n '6,11p' "$0" | sed 's/^# \{0,1\}//' >&2; exit "${1:-2}"; }
case "${1:-}" in -h|--help) usage 0 ;; esac

DG_COMMIT=54e22612409371d6364144b69086735beb54e98b       # 2026-06-23, "Multiple updates and refactorings (#364)"
CUTLASS_COMMIT=f3fde58372d33e9a5650ba7b80fc48b3b49d40c8  # third-party/cutlass at DG_COMMIT (CUTLASS 4.2)
FMT_COMMIT=553ec11ec06fbe0beebfbb45f9dc3c9eabd83d28      # third-party/fmt at DG_COMMIT
CUTLASS_PIN=nvidia-cutlass==4.2.0.0
OUT_DIR=${1:-.gpu-deps}
[ -n "${DEEPGEMM_GIT:-}" ] || { echo "error: DEEPGEMM_GIT is not set" >&2; usage; }
[ -n "${FMT_GIT:-}" ] || { echo "error: FMT_GIT is not set" >&2; usage; }
CUTLASS_GIT=${CUTLASS_GIT:-}
PYTHON=${PYTHON:-python3}
OUT="$OUT_DIR/deepgemm-src.tar.xz"
NAME=deepgemm-${DG_COMMIT:0:7}

has_commit() { git --git-dir="$1" cat-file -e "$2^{commit}" 2>/dev/null; }
has_commit "$DEEPGEMM_GIT" "$DG_COMMIT" || { echo "error: $DEEPGEMM_GIT lacks DeepGEMM commit $DG_COMMIT" >&2; exit 1; }
has_commit "$FMT_GIT" "$FMT_COMMIT" || { echo "error: $FMT_GIT lacks fmt commit $FMT_COMMIT" >&2; exit 1; }

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
SRC="$WORK/$NAME"
mkdir -p "$SRC/third-party/cutlass" "$SRC/third-party/fmt"
git --git-dir="$DEEPGEMM_GIT" archive --format=tar "$DG_COMMIT" | tar -x -C "$SRC"
git --git-dir="$FMT_GIT" archive --format=tar "$FMT_COMMIT" include | tar -x -C "$SRC/third-party/fmt"
if [ -n "$CUTLASS_GIT" ] && has_commit "$CUTLASS_GIT" "$CUTLASS_COMMIT"; then
  # A fetched snapshot may lack some large blobs (images outside include/): git archive then complains about
  # them on stderr; what matters is that every header under include/ arrived, counted below.
  git --git-dir="$CUTLASS_GIT" archive --format=tar "$CUTLASS_COMMIT" include/cute include/cutlass 2>"$WORK/archive.err" \
    | tar -x -C "$SRC/third-party/cutlass"
  want=$(git --git-dir="$CUTLASS_GIT" ls-tree -r --name-only "$CUTLASS_COMMIT" include/cute include/cutlass | wc -l)
  got=$(find "$SRC/third-party/cutlass/include" -type f | wc -l)
  [ "$want" -eq "$got" ] || { cat "$WORK/archive.err" >&2; echo "error: $got of $want CUTLASS headers packed" >&2; exit 1; }
  echo "NVIDIA/cutlass $CUTLASS_COMMIT" > "$SRC/third-party/cutlass/SOURCE"
else
  echo "no CUTLASS git dir with $CUTLASS_COMMIT: taking the headers from $CUTLASS_PIN" >&2
  "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: -d "$WORK/wheel" "$CUTLASS_PIN"
  "$PYTHON" - "$(ls "$WORK"/wheel/nvidia_cutlass-*.whl | head -1)" "$SRC/third-party/cutlass/include" <<'PY'
import os, sys, zipfile
wheel, dest = sys.argv[1], sys.argv[2]
prefix = "cutlass_library/source/include/"
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if name.startswith(prefix) and not name.endswith("/") and name[len(prefix):].split("/")[0] in ("cute", "cutlass"):
            target = os.path.join(dest, name[len(prefix):])
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with z.open(name) as fi, open(target, "wb") as fo:
                fo.write(fi.read())
PY
  echo "$CUTLASS_PIN" > "$SRC/third-party/cutlass/SOURCE"
fi
for f in third-party/cutlass/include/cutlass/cutlass.h third-party/cutlass/include/cute/tensor.hpp \
         third-party/fmt/include/fmt/format.h csrc/python_api.cpp setup.py; do
  [ -f "$SRC/$f" ] || { echo "error: packed tree lacks $f" >&2; exit 1; }
done
echo "$DG_COMMIT" > "$SRC/DEEPGEMM_COMMIT"

mkdir -p "$OUT_DIR"
tar -C "$WORK" -cf - "$NAME" | xz -T0 -6 > "$WORK/out.tar.xz"
mv "$WORK/out.tar.xz" "$OUT"  # whole file or nothing
SIZE=$(stat -c %s "$OUT")
echo "wrote $OUT ($((SIZE / 1024)) KiB, tree $NAME)"
if [ "$SIZE" -gt $((20 * 1024 * 1024)) ]; then echo "error: $OUT is over 20 MiB" >&2; exit 1; fi
