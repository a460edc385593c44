#!/usr/bin/env bash
# The main job: a local CPU comparison of both backends at 1 and 2 workers on jobs/smoke.toml, then the report.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
JOB=${JOB:-jobs/smoke.toml}
OUT=${OUT:-demo-results}
MODE=${MODE:-fit}
export TF_USE_LEGACY_KERAS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$OUT"
run() { echo; echo "=== $*"; "$@"; }
# One at a time: on a small machine concurrent runs would measure each other.
run $PY -m backends.native --job "$JOB" --set mode="$MODE" --results "$OUT" --quiet
run $PY -m backends.native --nproc 2 --job "$JOB" --set mode="$MODE" --results "$OUT" --quiet
run .venv/bin/horovodrun -np 1 -H localhost:1 --gloo $PY -m backends.horovod --job "$JOB" --set mode="$MODE" --results "$OUT" --quiet
run .venv/bin/horovodrun -np 2 -H localhost:2 --gloo $PY -m backends.horovod --job "$JOB" --set mode="$MODE" --results "$OUT" --quiet
echo
$PY -m common.report "$OUT" --out "$OUT/report"
