#!/usr/bin/env bash
# The whole GPU suite in one call on a GPU machine: every `-m gpu` test, and
# `dsa-runtime conformance <backend> --full --device cuda` for every backend available there that claims CUDA,
# ending with one summary line (exit status 0 only when everything passed). Every change to a GPU path is
# checked with it.
#
# usage: tools/gpu/run_gpu_suite.sh [PYTEST_ARGS...]     (extra arguments go to pytest, e.g. -x)
# env:   PYTHON         interpreter (default python3)
#        SUITE_OUT      folder for the logs and JSON reports (default $OUT when set, else /tmp/dsa-gpu-suite)
#        SUITE_WORKERS  pytest-xdist workers sharing the GPU (default 4, 2 under 100 GB; JIT compiles dominate)
#        SKIP_CONFORMANCE=1 / SKIP_PYTEST=1   run one half only
#        BACKENDS="triton tilelang"           certify only these (default: every available CUDA backend)
#
# Optional kernel libraries, prepared from .gpu-deps/ when present (a GPU machine without internet: make them
# here with tools/gpu/pack_tilelang.sh, pack_flashmla.sh and pack_deepgemm.sh, then carry .gpu-deps):
#   .gpu-deps/tilelang/*.tar.xz      unpacked into .gpu-deps/tilelang-site (on PYTHONPATH)
#   .gpu-deps/flashmla-src.tar.xz    built by tools/gpu/build_flashmla.sh (~2 min once; a build is kept)
#   .gpu-deps/deepgemm-src.tar.xz    built by tools/gpu/build_deepgemm.sh (~1 min once)
# The builds run beside the certification of the backends that need neither. dsa-runtime itself is installed
# (--no-deps, editable) when `import dsa_runtime` fails.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
PY=${PYTHON:-python3}
LOGS=${SUITE_OUT:-${OUT:-/tmp/dsa-gpu-suite}}
SUMMARY="$PY $ROOT/tools/gpu/suite_summary.py"
mkdir -p "$LOGS"
start=$(date +%s)
note() { echo "[gpu-suite $(( $(date +%s) - start )) s] $*"; }
# A suite stopped from outside (a time limit's SIGTERM) takes its background builds and certifications with it:
# left running, they held the GPU through the timings that followed (2026-12-07, H100).
stop_jobs() { trap - TERM INT; kill -TERM $(jobs -p) 2>/dev/null; wait; exit 143; }
trap stop_jobs TERM INT

# --- set-up ------------------------------------------------------------------------------------------------------
if ls .gpu-deps/tilelang/*.tar.xz >/dev/null 2>&1; then
  site=.gpu-deps/tilelang-site
  if [ ! -d "$site/tilelang" ]; then
    mkdir -p "$site"
    for a in .gpu-deps/tilelang/*.tar.xz; do tar -xJf "$a" -C "$site"; done
  fi
  export PYTHONPATH="$ROOT/$site${PYTHONPATH:+:$PYTHONPATH}"
  note "tilelang from $site"
fi
# Both packages: a machine where only dsa-runtime was installed by hand would otherwise skip the example backend's
# certification and its tests without a word.
if ! "$PY" -c "import dsa_runtime, dsa_example_backend" 2>/dev/null; then
  "$PY" -m pip install -q --no-deps --no-build-isolation -e . -e examples/dsa-example-backend > "$LOGS/install.txt" 2>&1 \
    || { cat "$LOGS/install.txt"; echo "gpu-suite: FAIL (could not install dsa-runtime)"; exit 1; }
fi
gpu=$("$PY" -c "import torch; print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')")
[ -n "$gpu" ] || { echo "gpu-suite: FAIL (no CUDA device visible to torch)"; exit 1; }
note "GPU: $gpu; torch $("$PY" -c 'import torch; print(torch.__version__)')"

builds=()
for lib in flashmla deepgemm; do
  if [ -f ".gpu-deps/$lib-src.tar.xz" ]; then
    PYTHON=$PY "tools/gpu/build_$lib.sh" > "$LOGS/$lib-build.txt" 2>&1 &
    builds+=("$lib:$!")
  fi
done

kit_jobs=()
certified=" "
certify() {  # conformance of one backend in the background; its JSON report is read at the end
  case "$certified" in *" $1 "*) return ;; esac
  certified+="$1 "
  note "conformance $1 --full --device cuda"
  "$PY" -m dsa_runtime.cli.main conformance "$1" --full --device cuda --failures-only --no-progress \
    --json "$LOGS/conformance-$1.json" > "$LOGS/conformance-$1.txt" 2>&1 &
  kit_jobs+=("$1:$!")
}
certify_available() {
  [ "${SKIP_CONFORMANCE:-0}" != 1 ] || return 0
  for backend in ${BACKENDS:-$($SUMMARY backends)}; do certify "$backend"; done
}

failed=0
certify_available
for item in ${builds[@]+"${builds[@]}"}; do
  lib=${item%%:*}
  if wait "${item##*:}"; then
    # shellcheck disable=SC1090
    source ".gpu-deps/$lib.env"
    note "$lib ready ($(grep -m1 -o 'built .* in [0-9]* s' "$LOGS/$lib-build.txt" || echo 'an earlier build'))"
  else
    note "$lib build failed (see $LOGS/$lib-build.txt)"
    failed=1
  fi
done
certify_available  # the backends the builds made available

# --- pytest -m gpu, beside the certifications ----------------------------------------------------------------------
pytest_summary="pytest -m gpu: not run"
if [ "${SKIP_PYTEST:-0}" != 1 ]; then
  par=()
  # 4 workers beside the conformance jobs fit a 141 GB H200; on an 80 GB H100 the 128K-key kit cases ran out of
  # memory with 4 (2026-11-26), so cards under 100 GB get 2.
  gib=$("$PY" -c "import torch; print(torch.cuda.get_device_properties(0).total_memory >> 30)")
  workers=${SUITE_WORKERS:-$([ "$gib" -ge 100 ] && echo 4 || echo 2)}
  "$PY" -c "import xdist" 2>/dev/null && par=(-n "$workers")
  note "pytest -m gpu tests ${par[*]}"
  "$PY" -m pytest -m gpu tests -q -rfEs -p no:cacheprovider --durations=15 ${par[@]+"${par[@]}"} \
    --junitxml="$LOGS/pytest-gpu.xml" "$@" > "$LOGS/pytest-gpu.txt" 2>&1 &
  wait $!  # in the background: bash runs the TERM trap at once during `wait`, not after a foreground command ends
  rc=$?
  tail -n 60 "$LOGS/pytest-gpu.txt"
  pytest_summary=$($SUMMARY junit "$LOGS/pytest-gpu.xml")
  # Exit 5 (no test selected) fails too: on a GPU machine it means the suite is broken.
  [ "$rc" -eq 0 ] || failed=1
fi

# --- the certifications' results ------------------------------------------------------------------------------------
kit_summary=""
for item in ${kit_jobs[@]+"${kit_jobs[@]}"}; do
  backend=${item%%:*}
  wait "${item##*:}" || failed=1
  note "conformance $backend:"
  tail -n 4 "$LOGS/conformance-$backend.txt"
  kit_summary+="${kit_summary:+, }$backend $($SUMMARY kit "$LOGS/conformance-$backend.json")"
done

verdict=PASS
[ "$failed" -eq 0 ] || verdict=FAIL
echo "gpu-suite: $verdict on $gpu in $(( $(date +%s) - start )) s | $pytest_summary | conformance --full: ${kit_summary:-not run}"
exit "$failed"
