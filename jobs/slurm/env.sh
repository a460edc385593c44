# twinbench: the environment preamble shared by native.sbatch and horovod.sbatch (sourced, never run).
# Both backends start from exactly this, so a comparison never measures two environments.
#
#   TWINBENCH_REPO       repository root (default: the directory sbatch was called from, $SLURM_SUBMIT_DIR)
#   TWINBENCH_MODULES    site modules to load first, e.g. "cuda/12.2 nccl" (default: none)
#   TWINBENCH_MODULE_PURGE=1  `module purge` before loading them (as IDRIS writes it; only where `module` exists)
#   TWINBENCH_HINT       srun --hint for every launch (default nomultithread: one task per physical core, as
#                        IDRIS writes it; empty: no --hint, the site's default)
#   TWINBENCH_SRUN_MPI   srun --mpi of the Horovod launch: pmix (default), pmi2, pmix_v4 or none
#   TWINBENCH_CONDA_ENV  conda environment to activate (default: none; then the repo's .venv when present,
#                        else whatever `python` is on PATH)
#   TWINBENCH_IFACE      data network interface, the same name on every node (e.g. ib0): Gloo, Open MPI, NCCL,
#                        horovodrun --network-interface and the native workers' addresses (the backends' --iface)
# Relative job and results paths are relative to the repository root.

tb_log() { printf '[twinbench] %s\n' "$*"; }
tb_die() { printf '[twinbench] error: %s\n' "$*" >&2; exit 2; }

TWINBENCH_REPO=${TWINBENCH_REPO:-${SLURM_SUBMIT_DIR:-$PWD}}
[ -f "$TWINBENCH_REPO/backends/native.py" ] \
  || tb_die "$TWINBENCH_REPO is not the twinbench repository: submit from its root or set TWINBENCH_REPO"
cd "$TWINBENCH_REPO" || tb_die "cannot cd to $TWINBENCH_REPO"
export TWINBENCH_REPO

# -- software: modules, then conda or the repo's .venv -------------------------------------------------
set +u  # module and conda scripts read unset variables
if [ "${TWINBENCH_MODULE_PURGE:-0}" = 1 ] && command -v module >/dev/null 2>&1; then
  tb_log "module purge"
  module purge || tb_die "module purge failed"
fi
if [ -n "${TWINBENCH_MODULES:-}" ]; then
  command -v module >/dev/null 2>&1 || tb_die "TWINBENCH_MODULES is set but there is no 'module' command"
  # shellcheck disable=SC2086
  module load $TWINBENCH_MODULES || tb_die "module load $TWINBENCH_MODULES failed"
fi
if [ -n "${TWINBENCH_CONDA_ENV:-}" ]; then
  command -v conda >/dev/null 2>&1 || tb_die "TWINBENCH_CONDA_ENV is set but there is no 'conda' command"
  eval "$(conda shell.bash hook)" && conda activate "$TWINBENCH_CONDA_ENV" \
    || tb_die "conda activate $TWINBENCH_CONDA_ENV failed"
elif [ -x "$TWINBENCH_REPO/.venv/bin/python" ]; then
  export VIRTUAL_ENV=$TWINBENCH_REPO/.venv
  export PATH=$VIRTUAL_ENV/bin:$PATH
fi
set -u
# The site's container (TWINBENCH_CONTAINER=RUNTIME:IMAGE, TWINBENCH_CONTAINER_BINDS, TWINBENCH_CONTAINER_PYTHON;
# docs/cluster.md#containers): every task of both backends runs in the image, one container per task started by
# srun outside it (the runtimes' hybrid model). TB_CT_SRUN holds pyxis' srun options, TB_CT_PREFIX the other
# runtimes' words before the command, TB_PY the image's Python (common/cluster/container.py).
if [ -n "${TWINBENCH_CONTAINER:-}" ]; then
  command -v python3 >/dev/null 2>&1 || tb_die "TWINBENCH_CONTAINER needs python3 on the host to build its lines"
  tb_ct=$(python3 -m common.cluster.container shell) || exit 2
  eval "$tb_ct"
  tb_log "container: $TB_CT_TEXT"
else
  command -v python >/dev/null 2>&1 || tb_die "no python on PATH (set TWINBENCH_CONDA_ENV or run make setup)"
  TB_CT_SRUN=(); TB_CT_PREFIX=(); TB_PY=python
fi

# -- process environment -------------------------------------------------------------------------------
# gRPC (MWMS) and Gloo rendezvous must not go through a site HTTP proxy (the backends drop these too).
unset http_proxy https_proxy HTTP_PROXY HTTPS_PROXY
export TF_USE_LEGACY_KERAS=1                      # tf_keras in both backends (Keras 3 breaks MWMS fit)
export PYTHONPATH=$TWINBENCH_REPO${PYTHONPATH:+:$PYTHONPATH}
# Slurm 22.05's srun no longer inherits --cpus-per-task from the job: pass it on, or each task gets one core.
if [ -n "${SLURM_CPUS_PER_TASK:-}" ]; then export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK; fi
# One task failing ends the step (srun --kill-on-bad-exit): its peers would otherwise wait for it until --time.
export SLURM_KILL_BAD_EXIT=1
# Native workers listen on port base + SLURM_LOCALID (SlurmClusterResolver): a base per job, so that two jobs
# sharing a node, or a job right after another (ports in TIME_WAIT), do not collide. 12000..19999 (IDRIS allows
# 10000-20000), 32 ports per job; TWINBENCH_PORT_BASE (or --port-base after the job arguments) overrides it.
TB_PORT_BASE=${TWINBENCH_PORT_BASE:-$((12000 + (${SLURM_JOB_ID:-0} % 250) * 32))}
# One data interface for every launcher (the backends read TWINBENCH_IFACE as their --iface default and check it on
# every node; the batch host is checked here, before anything starts). Empty: each launcher picks its own.
if [ -n "${TWINBENCH_IFACE:-}" ]; then
  [ -e "/sys/class/net/$TWINBENCH_IFACE" ] || tb_die "TWINBENCH_IFACE=$TWINBENCH_IFACE: no such network" \
    "interface on $(hostname) (it has: $(ls /sys/class/net | tr '\n' ' '))"
  export TWINBENCH_IFACE HOROVOD_GLOO_IFACE=$TWINBENCH_IFACE NCCL_SOCKET_IFNAME=$TWINBENCH_IFACE
  export OMPI_MCA_btl_tcp_if_include=$TWINBENCH_IFACE OMPI_MCA_oob_tcp_if_include=$TWINBENCH_IFACE
fi
TB_HVD_NIC=()  # horovodrun's own option for it, across nodes only: with every host local horovodrun looks for
# 127.0.0.1 on the named interface and stops ("No interface is found for address 127.0.0.1"); the ranks' own
# HOROVOD_GLOO_IFACE above still applies there.
if [ -n "${TWINBENCH_IFACE:-}" ] && [ "${SLURM_JOB_NUM_NODES:-1}" -gt 1 ]; then
  TB_HVD_NIC=(--network-interface "$TWINBENCH_IFACE")
fi

# horovodrun -H: "node1:4,node2:4" from the allocation (scontrol show hostnames + SLURM_TASKS_PER_NODE "4(x2)").
tb_hvd_hosts() {
  local -a hosts counts=() parts
  local part n r i out=""
  mapfile -t hosts < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
  IFS=, read -ra parts <<<"${SLURM_TASKS_PER_NODE:-1}"
  for part in "${parts[@]}"; do
    if [[ $part =~ ^([0-9]+)\(x([0-9]+)\)$ ]]; then n=${BASH_REMATCH[1]}; r=${BASH_REMATCH[2]}; else n=$part; r=1; fi
    for ((i = 0; i < r; i++)); do counts+=("$n"); done
  done
  for i in "${!hosts[@]}"; do out+="${out:+,}${hosts[$i]}:${counts[$i]:-1}"; done
  printf '%s\n' "$out"
}

# srun's options of the launch line: --hint (TWINBENCH_HINT) for both scripts, --mpi for Horovod's srun launch.
TWINBENCH_HINT=${TWINBENCH_HINT-nomultithread}
TB_SRUN_HINT=()
if [ -n "$TWINBENCH_HINT" ]; then TB_SRUN_HINT=(--hint="$TWINBENCH_HINT"); fi
TWINBENCH_SRUN_MPI=${TWINBENCH_SRUN_MPI:-pmix}
case $TWINBENCH_SRUN_MPI in
  pmix | pmi2 | pmix_v4 | none) ;;
  *) tb_die "TWINBENCH_SRUN_MPI must be pmix, pmi2, pmix_v4 or none, not '$TWINBENCH_SRUN_MPI'" ;;
esac
export TWINBENCH_HINT TWINBENCH_SRUN_MPI

# -- what this run is: into the log ----------------------------------------------------------------------
tb_log "job ${SLURM_JOB_ID:-none} '${SLURM_JOB_NAME:-}' on ${SLURM_JOB_NODELIST:-$(hostname)}:" \
  "${SLURM_NNODES:-1} node(s), ${SLURM_NTASKS:-1} task(s) (${SLURM_TASKS_PER_NODE:-1} per node)," \
  "${SLURM_CPUS_PER_TASK:-?} CPU(s) per task, GPUs ${SLURM_JOB_GPUS:-${SLURM_GPUS_ON_NODE:-none}}," \
  "started $(date -Is)"
tb_log "repo $TWINBENCH_REPO ($(git -C "$TWINBENCH_REPO" rev-parse --short HEAD 2>/dev/null || echo 'no git')," \
  "python $(command -v python)), port base $TB_PORT_BASE (native)"
tb_log "knobs:"
knobs='^(NCCL_|HOROVOD_|TF_(CPP|USE|CONFIG|ENABLE|GPU|XLA|FORCE|NUM|DETERMINISTIC|CUDNN)|CUDA_VISIBLE|OMPI_MCA_|UCX_'
knobs+='|PMIX_MCA_|SRUN_|SLURM_KILL_BAD_EXIT|TWINBENCH_)'
env | grep -E "$knobs" | sort | sed 's/^/    /' || true

# The launch line, echoed into the log with its exit status. A run stopped by SIGTERM/SIGUSR1 (--signal=USR1@120
# before the time limit, preemption) writes a checkpoint under RESULTS/checkpoints/ and exits 75 (horovodrun: 1);
# then the job requeues itself, and the same command resumes from the checkpoint (at most TWINBENCH_MAX_REQUEUE
# times, default 5).
tb_run() {
  local rc=0 marker restarts=${SLURM_RESTART_COUNT:-0}
  marker=$(mktemp "${TMPDIR:-/tmp}/twinbench-start.XXXXXX")
  tb_log "launch: $*"
  "$@" || rc=$?
  tb_log "exit status $rc at $(date -Is)"
  if [ "$rc" != 0 ] && [ -n "${SLURM_JOB_ID:-}" ] \
     && find "$TB_RESULTS/checkpoints" -name meta.json -newer "$marker" 2>/dev/null | grep -q .; then
    if [ "$restarts" -lt "${TWINBENCH_MAX_REQUEUE:-5}" ]; then
      tb_log "checkpoint written: requeueing job $SLURM_JOB_ID (restart $((restarts + 1))); it will resume"
      rm -f "$marker"
      scontrol requeue "$SLURM_JOB_ID" && exit 0
    else
      tb_log "checkpoint written but the job was already requeued $restarts times: not requeueing"
    fi
  fi
  rm -f "$marker"
  return "$rc"
}
