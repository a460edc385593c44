#!/usr/bin/env bash
# The main job: a local CPU comparison of both backends at 1 and 2 workers on jobs/demo.toml (a small CNN, custom loop),
# then the report, whose verdict lines end the output.
# Each run's full output goes to $OUT/logs/; on failure its tail is shown.
# The benchmark runs go in REPEATS paired rounds (default 4): each round runs every cell once, both backends of a size
# back to back, and names each run's file ...-r<k>.json, so the report pairs a round's two runs (same hosts) and gives
# the verdict the paired t interval of the per-round ratios (95%, from 3 rounds): on this machine's spread 4 such
# rounds reach a verdict at least as often as the former 6 unpaired rounds, in 2/3 of their time
# (bench/verdict_design.py; docs/measurement.md).
# UNTIL=5% (or 0.05): after the REPEATS rounds, add one interleaved round of every cell at a time until every cell's
# 95% interval of its median is within 5% of it (python -m common.report DIR --until 5%: never before 6 repeats, as a
# 95% interval needs 6), or MAX_REPEATS (default 12) rounds have run; the last line says which (docs/measurement.md).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}  # the environment to run: .venv (TensorFlow 2.21) or .venv-tf2.18 (the fallback)
PY=$VENV/bin/python
JOB=${JOB:-jobs/demo.toml}
OUT=${OUT:-demo-results}
MODE=${MODE:-}  # fit or ctl for every run; empty: the job's own mode (the breakdown splits ctl jobs only)
STEPS=${STEPS:-200}  # the job file's 12 steps test correctness; 200 (10 untimed) give the timing something to average
REPEATS=${REPEATS:-4}  # paired rounds: 3 give the verdict a 95% interval, 4 decide more often; 6 also each cell a CI
UNTIL=${UNTIL:-}  # e.g. 5%: add rounds until every cell's interval is within 5% of its median (empty: REPEATS only)
export TF_USE_LEGACY_KERAS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PATH="$PWD/$VENV/bin:$PATH"
for v in REPEATS STEPS; do
  case ${!v} in ''|*[!0-9]*|0) echo "demo: $v must be a positive integer, got '${!v}'" >&2; exit 2 ;; esac
done
if ((STEPS <= 10)); then echo "demo: STEPS must exceed the 10 untimed warm-up steps, got $STEPS" >&2; exit 2; fi
if [[ -z $UNTIL && -n ${MAX_REPEATS:-} ]]; then echo "demo: MAX_REPEATS only applies with UNTIL (e.g. UNTIL=5%)" >&2; exit 2; fi
if [[ -n $UNTIL ]]; then
  MAX_REPEATS=${MAX_REPEATS:-12}  # the cap of UNTIL's rounds
  case $MAX_REPEATS in ''|*[!0-9]*|0) echo "demo: MAX_REPEATS must be a positive integer, got '$MAX_REPEATS'" >&2; exit 2 ;; esac
  if ((MAX_REPEATS < 6 || MAX_REPEATS < REPEATS)); then
    echo "demo: MAX_REPEATS must be at least 6 (a 95% interval of a median needs 6 repeats) and REPEATS ($REPEATS)," \
      "got $MAX_REPEATS" >&2; exit 2
  fi
  # the report's own rule for the width (common.report.converge.parse_width): one line and exit 2 on a bad one
  WITHIN=$($PY -c 'import sys
from common.report.converge import parse_width, percent
try:
    print(percent(parse_width(sys.argv[1])))
except ValueError as e:
    sys.exit("demo: " + str(e).replace("--until", "UNTIL", 1))' "$UNTIL") || exit 2  # as a percentage: 0.05 -> 5%
fi
SET_MODE=(); if [[ -n $MODE ]]; then SET_MODE=(--set mode="$MODE"); fi
# The job as every run would load it, its functions' arguments and its paths (common.workload.argcheck): a mistake
# is one line and exit 2 here, not the same error in each of the demo's runs. It prints the mode the runs get and
# why the step-time breakdown cannot split this job (empty when it can).
job_facts=$($PY -c 'import sys
from pathlib import Path
from common.diagnostics.breakdown import breakdown_refusal
from common.workload import argcheck
from common.workload.job import JobError, load_job
try:
    job = load_job(sys.argv[1], [f"steps={sys.argv[2]}", *(["mode=" + sys.argv[3]] if sys.argv[3] else [])])
    argcheck.refuse(job, Path.cwd())
except JobError as e:
    sys.exit(f"demo: JOB={sys.argv[1]}: {e}")
print(job.mode)
print(breakdown_refusal(job) or "")' "$JOB" "$STEPS" "$MODE") || exit 2
{ read -r RUN_MODE; read -r NO_BREAKDOWN || true; } <<< "$job_facts"
# How each backend's ranks are launched (Horovod: the controller its build has, or TWINBENCH_HOROVOD_CONTROLLER),
# resolved once and exported to every launch line; a launch that cannot run is one line and exit 2 here.
launch_said=$(mktemp "${TMPDIR:-/tmp}/twinbench-demo-launch.XXXXXX")
launch_vars=$($PY -m backends launch-env 2>"$launch_said") || { tail -n 1 "$launch_said" | sed 's/^backends: error: /demo: /' >&2; rm -f "$launch_said"; exit 2; }
LAUNCH_LINES=$(sed 's/^/[demo] /' "$launch_said"); rm -f "$launch_said"
while IFS= read -r kv; do [[ -n $kv ]] && export "${kv?}"; done <<< "$launch_vars"
mkdir -p "$OUT/logs"
# One demo is one comparison: results of an earlier demo are moved aside (kept, not read by the report).
if compgen -G "$OUT/*.json" > /dev/null; then
  prev="$OUT/previous/$(date -u +%Y%m%dT%H%M%SZ)"
  mkdir -p "$prev" && mv "$OUT"/*.json "$prev"/ && echo "earlier demo results moved to $prev/"
fi
FAILED=()   # runs that failed: named after the report, and the demo exits 1
SKIPPED=()  # diagnostics the job cannot have (their one-line refusal, exit 2): named, not a failure
# run NAME KIND CMD...: KIND "bench" (a benchmark cell) or "diag" (a diagnostic). A failed run is shown and
# remembered, never the end of the demo: the report of what ran always comes last.
run() {
  local name=$1 kind=$2 rc=0; shift 2
  printf '%-34s' "$name"
  local t0=$SECONDS
  "$@" > "$OUT/logs/$name.log" 2>&1 || rc=$?
  if ((rc == 0)); then
    local said; said=$(grep -ho 'results: .*' "$OUT/logs/$name.log" | tail -1 || true)
    local file=${said#results: }
    if [[ -n ${ROUND_TAG:-} && $file == *.json && -f $file ]]; then
      # the round in the file name (the report pairs a round's runs by it): ...-r<k>.json
      mv "$file" "${file%.json}$ROUND_TAG.json"; said="results: ${file%.json}$ROUND_TAG.json"
    fi
    echo "ok ($((SECONDS - t0)) s)  $said"
  elif [[ $kind == diag ]] && ((rc == 2)); then  # the diagnostic refuses this job (one line): not a failure
    local why; why=$(grep -v '^\s*$' "$OUT/logs/$name.log" | tail -1)
    echo "skipped: ${why#*error: }"; SKIPPED+=("$name: ${why#*error: }")
  else
    echo "FAILED (exit $rc), see $OUT/logs/$name.log:"; tail -20 "$OUT/logs/$name.log"; FAILED+=("$name")
  fi
}
COMMON=(--job "$JOB" ${SET_MODE[@]+"${SET_MODE[@]}"} --set steps="$STEPS" --set timing_warmup_steps=10 --results "$OUT")
echo "twinbench demo: $JOB, mode $RUN_MODE$([[ -n $MODE ]] && echo " (MODE=$MODE)" || echo " (the job's)"), $STEPS steps, $REPEATS paired round(s)${UNTIL:+ then more until within $WITHIN (at most $MAX_REPEATS)}, results in $OUT/ (one run at a time: concurrent runs would measure each other)"
echo "$LAUNCH_LINES"
# One cell = one backend at one world size, started by the backend's own local launcher (python -m backends).
cell() {
  local backend=$1 n=$2 tag=$3 cmd
  mapfile -t cmd < <($PY -m backends command "$backend" "$n" "${COMMON[@]}")
  ROUND_TAG=$tag run "$backend-$n$tag" bench "${cmd[@]}"
}
mapfile -t BACKENDS < <($PY -m backends names)
CELLS=()
for n in 1 2; do for b in "${BACKENDS[@]}"; do CELLS+=("$b $n"); done; done
# Rounds give the report its intervals: the verdict's paired interval from 3 rounds (a round's two runs of a size run
# back to back, so what the machine did to that round, another job or thermal drift, hits both and cancels in their
# ratio); each cell's own 95% CI from 6. Cells are interleaved, in reverse order every other round, so that a drift
# within a round also hits both backends alike instead of one backend's block of runs.
one_round() {
  local r=$1 i j b n tag=""
  if ((REPEATS > 1)) || [[ -n $UNTIL ]]; then tag="-r$r"; fi
  for ((i = 0; i < ${#CELLS[@]}; i++)); do
    j=$(( r % 2 == 0 ? ${#CELLS[@]} - 1 - i : i ))
    read -r b n <<< "${CELLS[$j]}"
    cell "$b" "$n" "$tag"
  done
}
for ((r = 1; r <= REPEATS; r++)); do one_round "$r"; done
# UNTIL: the report's check after every round (its table in $OUT/logs/until-r<N>.log; exit 0 converged, 1 not yet)
if [[ -n $UNTIL ]]; then
  r=$REPEATS
  while :; do
    rc=0; $PY -m common.report "$OUT" --until "$UNTIL" > "$OUT/logs/until-r$r.log" 2>&1 || rc=$?
    if ((rc == 0)); then
      echo "[demo] every cell within $WITHIN of its median after $r repeats"; break
    elif ((rc != 1)); then
      echo "[demo] the --until check FAILED, see $OUT/logs/until-r$r.log:"; tail -20 "$OUT/logs/until-r$r.log"
      FAILED+=("until-r$r"); break
    fi
    left=$(tail -1 "$OUT/logs/until-r$r.log" | sed 's/^not yet within [^:]*: //')
    if ((r >= MAX_REPEATS)); then
      grep -v '^not yet within' "$OUT/logs/until-r$r.log"
      echo "[demo] stopped at the cap of $MAX_REPEATS repeats, not every cell within $WITHIN of its median: $left"; break
    fi
    r=$((r + 1))
    echo "[demo] round $r (not yet within $WITHIN: $left)"
    one_round "$r"
  done
fi
# allreduce microbenchmark at 2 ranks (small sizes on a CPU): feeds the report's scaling model
BENCH=(--bench allreduce --sizes "${SIZES:-4K,64K,1M,4M}" --iters 10 --results "$OUT")
for b in "${BACKENDS[@]}"; do
  mapfile -t cmd < <($PY -m backends command "$b" 2 "${BENCH[@]}")
  run "allreduce-$b-2" diag "${cmd[@]}"
done
# Step-time breakdown: a DIAGNOSTIC run per backend x world size (the custom loop's step with its phases serialized
# and timed on the device; its own kind of record, never in the benchmark figures), after the benchmark runs so it
# cannot disturb them. It runs the benchmark's own job (same mode, same hash), so the report compares the two step
# times and the planner finds its overlap; it splits the custom loop's step only, so a fit job has none (said once:
# a breakdown of the ctl loop would be another job, whose "benchmark step" the report could not show).
DIAG=(--job "$JOB" ${SET_MODE[@]+"${SET_MODE[@]}"} --set steps="$STEPS" --set timing_warmup_steps=10
      --diagnose breakdown --results "$OUT")
BREAKDOWN_SKIPPED=""
if [[ -n $NO_BREAKDOWN ]]; then
  BREAKDOWN_SKIPPED=${NO_BREAKDOWN//--set mode=/MODE=}  # the breakdown's own one-line refusal, in the demo's terms
else
  for n in 1 2; do
    for b in "${BACKENDS[@]}"; do
      mapfile -t cmd < <($PY -m backends command "$b" "$n" "${DIAG[@]}")
      run "breakdown-$b-$n" diag "${cmd[@]}"
    done
  done
fi
# The parity check (python -m common.check) of the demo's own job, so that the report's "leave Horovod" table
# answers every row: each backend at 1 and 2 workers in the demo's mode, CHECK_STEPS steps each (its answers rest on
# per-step losses, not timing: 4 runs of a few seconds). Its runs go to $OUT/check/<backend>-<mode>-n<size>/, two
# levels below $OUT, where the report reads no benchmark run; it reads $OUT/check/check.json (common.report.migrate).
# The same --set as the benchmark runs (check.json holds the job without the check's own steps): the same job hash.
# Its answer is not a failure (exit 0; 1 same math no; 5, 6 or 7: its log's last lines say which); a check that
# wrote no verdict (a run failed) is.
CHECK_STEPS=6  # enough for a first difference (a Dropout model's at step 1, a reduction order's within a few)
if [[ -e $OUT/check ]]; then  # an earlier demo's check: kept aside with its results, not read by the report
  prev_check="$OUT/previous/check-$(date -u +%Y%m%dT%H%M%SZ)"; mkdir -p "$OUT/previous" && mv "$OUT/check" "$prev_check"
fi
printf '%-34s' "check"
t0=$SECONDS; check_rc=0
$PY -m common.check --job "$JOB" ${SET_MODE[@]+"${SET_MODE[@]}"} --set steps="$STEPS" --set timing_warmup_steps=10 \
  --steps "$CHECK_STEPS" --modes "$RUN_MODE" --timeout 600 --results "$OUT/check" > "$OUT/logs/check.log" 2>&1 || check_rc=$?
if [[ -f $OUT/check/check.json ]]; then
  echo "done ($((SECONDS - t0)) s, exit $check_rc): its answers in $OUT/logs/check.log"
  grep '^\[check\] \(same math\|scales exactly\|fit = custom loop\):' "$OUT/logs/check.log" | sed 's/^\[check\]/[demo] check:/'
else
  echo "FAILED (exit $check_rc), see $OUT/logs/check.log:"; tail -20 "$OUT/logs/check.log"; FAILED+=("check")
fi
echo
if [[ -n $BREAKDOWN_SKIPPED ]]; then echo "[demo] skipped the step-time breakdown: $BREAKDOWN_SKIPPED"; fi
for s in "${SKIPPED[@]}"; do echo "[demo] skipped $s"; done
if ((${#FAILED[@]})); then
  echo "[demo] ${#FAILED[@]} run(s) FAILED (${FAILED[*]}): the report below holds the runs that finished"
fi
echo "plots and the full report (scaling model and step-time breakdown included): $OUT/report/"
rc=0; $PY -m common.report "$OUT" --out "$OUT/report" || rc=$?  # tables, the files written, then the verdict lines
if ((${#FAILED[@]})); then exit 1; fi
exit $rc
