#!/usr/bin/env bash
# Stop a test cluster started by start_cluster.sh: slurmd, slurmctld, munged, by their PID files only.
#   tests/slurm/stop_cluster.sh [DIR]       (default: $TWINBENCH_SLURM_DIR)
# Jobs still running are cancelled first; their processes are children of slurmstepd and end with it.
# --keep leaves DIR (logs) in place; otherwise it is removed.
set -uo pipefail

keep=0
if [ "${1:-}" = --keep ]; then keep=1; shift; fi
DIR=${1:-${TWINBENCH_SLURM_DIR:-}}
if [ -z "$DIR" ] || [ ! -d "$DIR" ]; then
  echo "[stop_cluster] error: no cluster dir '$DIR' (pass it or set TWINBENCH_SLURM_DIR)" >&2; exit 2
fi
[ -d "$DIR/run" ] || { echo "[stop_cluster] error: $DIR is not a test cluster dir" >&2; exit 2; }

if [ -f "$DIR/run/slurmctld.pid" ] && [ -f "$DIR/etc/slurm.conf" ] && command -v scancel >/dev/null 2>&1; then
  SLURM_CONF=$DIR/etc/slurm.conf timeout 10 scancel --quiet --full "--user=$(id -un)" >/dev/null 2>&1 || true
fi

# SIGTERM to the three daemons at once (each takes about 2 s to exit), wait up to 10 s, then SIGKILL.
pids=()
for name in slurmd slurmctld munged; do
  pidfile=$DIR/run/$name.pid
  [ -f "$pidfile" ] || continue
  pid=$(cat "$pidfile" 2>/dev/null || true)
  # only if that pid is still the daemon (not a recycled pid of something else)
  if [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$name" ]; then
    kill -TERM "$pid" 2>/dev/null && pids+=("$name:$pid")
  fi
done
for _ in $(seq 100); do
  alive=0
  for entry in "${pids[@]}"; do kill -0 "${entry#*:}" 2>/dev/null && alive=1; done
  [ $alive = 0 ] && break
  sleep 0.1
done
for entry in "${pids[@]}"; do
  if kill -0 "${entry#*:}" 2>/dev/null; then
    echo "[stop_cluster] ${entry%%:*} (${entry#*:}) did not stop: SIGKILL" >&2
    kill -KILL "${entry#*:}" 2>/dev/null || true
  fi
done
rm -f "$DIR"/run/*.pid

if [ $keep = 0 ]; then
  rm -rf "$DIR"
else
  echo "[stop_cluster] stopped; logs kept in $DIR/log" >&2
fi
