#!/usr/bin/env bash
# The main job: a local CPU comparison of both backends at 1 and 2 workers on jobs/smoke.toml, then the report.
# Each run's full output goes to $OUT/logs/; on failure its tail is shown.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
JOB=${JOB:-jobs/smoke.toml}
OUT=${OUT:-demo-results}
MODE=${MODE:-fit}
export TF_USE_LEGACY_KERAS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PATH="$PWD/.venv/bin:$PATH"
mkdir -p "$OUT/logs"
run() {
  local name=$1; shift
  printf '%-34s' "$name"
  local t0=$SECONDS
  if "$@" > "$OUT/logs/$name.log" 2>&1; then
    echo "ok ($((SECONDS - t0)) s)  $(grep -ho 'results: .*' "$OUT/logs/$name.log" | tail -1)"
  else
    echo "FAILED, see $OUT/logs/$name.log:"; tail -20 "$OUT/logs/$name.log"; exit 1
  fi
}
COMMON=(--job "$JOB" --set mode="$MODE" --results "$OUT")
echo "twinbench demo: $JOB, mode $MODE, results in $OUT/ (one run at a time: concurrent runs would measure each other)"
run native-1 $PY -m backends.native "${COMMON[@]}"
run native-2 $PY -m backends.native --nproc 2 "${COMMON[@]}"
run horovod-1 horovodrun -np 1 -H localhost:1 --gloo $PY -m backends.horovod "${COMMON[@]}"
run horovod-2 horovodrun -np 2 -H localhost:2 --gloo $PY -m backends.horovod "${COMMON[@]}"
# allreduce microbenchmark at 2 ranks (small sizes on a CPU): feeds the report's scaling model
BENCH=(--bench allreduce --sizes "${SIZES:-4K,64K,1M,4M}" --iters 10 --results "$OUT")
run allreduce-native-2 $PY -m backends.native --nproc 2 "${BENCH[@]}"
run allreduce-horovod-2 horovodrun -np 2 -H localhost:2 --gloo $PY -m backends.horovod "${BENCH[@]}"
echo
$PY -m common.report "$OUT" --out "$OUT/report"
echo "plots and the full report (scaling model included): $OUT/report/"
