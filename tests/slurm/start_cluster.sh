#!/usr/bin/env bash
# A real single-node Slurm (Debian's slurm-wlm 22.05) for the tests, without systemd:
# munged, slurmctld and slurmd run as root with every key, socket, state, spool and log file in one
# temporary directory, so nothing in /etc is touched and several clusters can coexist on one host.
#
#   eval "$(tests/slurm/start_cluster.sh [DIR])"   # starts it; prints the environment to source
#   srun -n 2 hostname
#   tests/slurm/stop_cluster.sh "$TWINBENCH_SLURM_DIR"
#
# The node advertises 8 CPUs (SlurmdParameters=config_overrides, whatever the host has) and 8 GPUs whose
# gres.conf File= entries are character devices made with mknod in DIR/dev (Slurm rejects plain files, and
# count-only gres drains the node); there is no GPU behind them, but Slurm sets CUDA_VISIBLE_DEVICES per
# task as on a real GPU node. MpiDefault=pmix: `srun --mpi=pmix` works with Debian's OpenMPI 4.1.4.
#
# Installs slurm-wlm and munge with apt-get when missing (root only). Stdout carries only the `export`
# lines (also written to DIR/env.sh); progress and errors go to stderr. Exit 1 if a daemon does not come up
# (its log is shown). Environment: TWINBENCH_SLURM_CPUS (8), TWINBENCH_SLURM_GPUS (8),
# TWINBENCH_SLURM_INSTALL (1; 0 = fail instead of running apt-get).
set -euo pipefail

log() { printf '[start_cluster] %s\n' "$*" >&2; }
die() {  # stop whatever this script started (logs kept in DIR/log), then fail
  log "error: $*"
  if [ "${STARTED:-0}" = 1 ]; then bash "$(dirname "$0")/stop_cluster.sh" --keep "$DIR" || true; fi
  exit 1
}

CPUS=${TWINBENCH_SLURM_CPUS:-8}
GPUS=${TWINBENCH_SLURM_GPUS:-8}

# -- packages ------------------------------------------------------------------------------------------
need=()
command -v slurmctld >/dev/null 2>&1 && command -v slurmd >/dev/null 2>&1 && command -v srun >/dev/null 2>&1 \
  || need+=(slurm-wlm)
command -v munged >/dev/null 2>&1 || need+=(munge)
if [ ${#need[@]} -gt 0 ]; then
  [ "${TWINBENCH_SLURM_INSTALL:-1}" = 1 ] || die "missing ${need[*]} (TWINBENCH_SLURM_INSTALL=0: not installing)"
  [ "$(id -u)" = 0 ] || die "missing ${need[*]} and not root: apt-get install -y ${need[*]}"
  log "installing ${need[*]} (apt-get)"
  # policy-rc.d: the packages' maintainer scripts must not start system-wide daemons (init.d or systemd).
  policy=/usr/sbin/policy-rc.d; made_policy=0
  if [ ! -e "$policy" ]; then printf '#!/bin/sh\nexit 101\n' >"$policy"; chmod 755 "$policy"; made_policy=1; fi
  apt_ok=1
  apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >&2 || apt_ok=0
  if [ $made_policy = 1 ]; then rm -f "$policy"; fi
  [ $apt_ok = 1 ] || die "apt-get install ${need[*]} failed"
fi
[ "$(id -u)" = 0 ] || die "the test cluster runs its daemons as root (SlurmUser=root); run as root"

# -- layout --------------------------------------------------------------------------------------------
DIR=${1:-}
if [ -z "$DIR" ]; then DIR=$(mktemp -d /tmp/twinbench-slurm.XXXXXX); else mkdir -p "$DIR"; fi
DIR=$(cd "$DIR" && pwd -P)
chmod 755 "$DIR"   # munged wants every directory on its socket path to be 0755 (mktemp -d makes 0700)
[ ! -e "$DIR/run/slurmctld.pid" ] || die "$DIR already has a running cluster (stop it with stop_cluster.sh)"
mkdir -p "$DIR"/{etc,dev,state,spool,log,run,tmp,munge-run}
mkdir -p -m 700 "$DIR/munge"
chmod 755 "$DIR"/{etc,dev,state,spool,log,run,munge-run}
chmod 1777 "$DIR/tmp"

HOST=$(hostname -s)
getent hosts "$HOST" >/dev/null || die "host name $HOST does not resolve (add it to /etc/hosts)"

free_ports() {  # two free TCP ports: slurmctld, slurmd (several clusters may run on one host)
  python3 - <<'EOF' 2>/dev/null || echo "6817 6818"
import socket
s = [socket.socket() for _ in range(2)]
for x in s:
    x.bind(("", 0))
print(*(x.getsockname()[1] for x in s))
EOF
}
read -r CTLD_PORT SLURMD_PORT < <(free_ports)

# -- munge ---------------------------------------------------------------------------------------------
KEY=$DIR/munge/munge.key
SOCK=$DIR/munge-run/munge.socket.2
if command -v mungekey >/dev/null 2>&1; then
  mungekey --create --keyfile="$KEY" --force >&2
else
  dd if=/dev/urandom of="$KEY" bs=1 count=1024 status=none
fi
chmod 600 "$KEY"
STARTED=1  # from here on, a failure stops what was started
munged --key-file="$KEY" --socket="$SOCK" --pid-file="$DIR/run/munged.pid" --log-file="$DIR/log/munged.log" \
  --seed-file="$DIR/munge/munged.seed" --force \
  || { cat "$DIR/log/munged.log" >&2 2>/dev/null; die "munged did not start"; }
for _ in $(seq 50); do [ -S "$SOCK" ] && break; sleep 0.1; done
[ -S "$SOCK" ] || die "munged socket $SOCK did not appear"

# -- fake GPUs: character devices (same major as /dev/nvidiaN) -----------------------------------------
for ((i = 0; i < GPUS; i++)); do
  [ -c "$DIR/dev/nvidia$i" ] || mknod "$DIR/dev/nvidia$i" c 195 "$i"
done

# -- configuration -------------------------------------------------------------------------------------
CONF=$DIR/etc/slurm.conf
cat >"$CONF" <<EOF
# twinbench test cluster (generated by tests/slurm/start_cluster.sh)
ClusterName=twinbench
SlurmctldHost=$HOST
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$SOCK,cred_expire=10
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/slurmd-%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
TmpFS=$DIR/tmp
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=pmix
GresTypes=gpu
SlurmdParameters=config_overrides
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
ReturnToService=2
MinJobAge=3600
KillWait=5
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=60
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$CPUS Boards=1 SocketsPerBoard=1 CoresPerSocket=$CPUS ThreadsPerCore=1 RealMemory=4000 Gres=gpu:$GPUS State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
if [ "$GPUS" -gt 0 ]; then
  echo "NodeName=$HOST Name=gpu File=$DIR/dev/nvidia[0-$((GPUS - 1))]" >"$DIR/etc/gres.conf"
else
  sed -i -e 's/ Gres=gpu:0//' "$CONF"; : >"$DIR/etc/gres.conf"
fi
export SLURM_CONF=$CONF

# -- daemons -------------------------------------------------------------------------------------------
show_log() { tail -n 30 "$DIR/log/$1.log" >&2 2>/dev/null || true; }
slurmctld -f "$CONF" -c || { show_log slurmctld; die "slurmctld did not start"; }
slurmd -f "$CONF" || { show_log slurmd; die "slurmd did not start"; }
state=""
for _ in $(seq 150); do
  state=$(sinfo -h -n "$HOST" -o %T 2>/dev/null | head -n1 || true)
  [ "$state" = idle ] && break
  sleep 0.2
done
if [ "$state" != idle ]; then
  show_log slurmctld; show_log slurmd
  die "node $HOST is '${state:-unreachable}', not idle, after 30 s (logs in $DIR/log)"
fi

cat >"$DIR/env.sh" <<EOF
export SLURM_CONF=$CONF
export TWINBENCH_SLURM_DIR=$DIR
EOF
log "cluster up in $DIR: node $HOST, $CPUS CPUs, gpu:$GPUS, slurmctld port $CTLD_PORT (source $DIR/env.sh)"
cat "$DIR/env.sh"
