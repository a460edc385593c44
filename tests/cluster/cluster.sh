#!/usr/bin/env bash
# An emulated N-node cluster on this one Linux machine: every node is a network + UTS + mount namespace with its
# own host name (node1..nodeN), its own address on a private bridge and the same data interface name (tb0), one
# slurmd and one sshd; slurmctld, munged and the clients (srun, sbatch, squeue, ssh) live in a "login" namespace
# on the same bridge, so srun's I/O callbacks reach it from the nodes as on a real cluster.
#
#   tests/cluster/cluster.sh start [--nodes N] [--cpus C] [--gpus G] [--net X] DIR
#   tests/cluster/cluster.sh run DIR node1|...|login CMD...   # CMD inside that namespace (SLURM_CONF set)
#   tests/cluster/cluster.sh shape DIR RATE|off               # tbf on every node's egress, e.g. 200mbit
#   tests/cluster/cluster.sh cut DIR nodeK / heal DIR nodeK   # unplug / replug nodeK's link (heal re-registers it)
#   tests/cluster/cluster.sh cpus DIR split|shared            # each node on its own share of the host's CPUs, or not
#   tests/cluster/cluster.sh status DIR
#   tests/cluster/cluster.sh stop DIR                         # idempotent, also after a failed start
#
# Addresses: 10.213.X.0/24, X the first free index (or --net X); login is .1, nodeK is .(10+K). The bridge sits in
# a separate "switch" namespace, so the root namespace gets no interface, and before anything else the root
# namespace gets an `unreachable` route for the subnet: a client started there by mistake fails at once instead of
# sending packets for the test subnet out along the default route. Namespaces are named tbX-login, tbX-sw,
# tbX-node1...; a subnet whose names, routes or addresses exist already is never used.
#
# CPUs: by default every node runs on all of the host's CPUs ("shared"). `cpus split` gives node K its own share
# (`taskset`, contiguous blocks; fewer CPUs than nodes: round robin), as separate machines have: it rebinds the
# node's slurmd and sshd, whose children (job steps, ssh sessions) inherit the mask, and `run` on a node starts
# its command there; processes already running keep theirs. Why it matters: a process that busy-polls (Open MPI
# inside a collective) on one emulated node takes CPU from the other nodes and from the kernel's packet path.
#
# Slurm (Debian's 22.05): nodes advertise C CPUs (default 2, so `srun -N2 -n4` places 2 tasks per node; every node
# shares the host's cores, and SlurmdParameters=config_overrides lets C exceed them) and G fake GPUs (default 2,
# one per task: character devices in DIR/dev, as tests/slurm/start_cluster.sh makes them);
# MpiDefault=none, `srun --mpi=pmix` works. Each node has its own spool, log, pid file and TmpFS (PMIx creates the
# same spmix_appdir path on every node). ssh: host keys and a client key are generated in DIR; inside the
# namespaces /usr/bin/ssh is overlaid (private mount) by a wrapper that runs the real ssh with DIR/ssh/config, so
# plain `ssh node2` (what horovodrun and mpirun run) works as root without reading or creating ~/.ssh.
#
# State (config, keys, pid files, logs) lives in DIR; DIR/created lists every namespace and route this cluster
# made, and stop removes exactly those. Daemons are stopped by their recorded PIDs, each checked to still be the
# same program inside this cluster's namespace (all namespaces share one PID space, and PIDs get reused); jobs are
# cancelled through Slurm first, and a process still left inside the cluster's own network namespaces afterwards (a
# job step whose slurmd is gone, an ssh session) is ended too, by PID, since nothing else can be in there.
# Root only. Missing packages are installed by scripts/setup.sh (TWINBENCH_WITH_SLURM=1) unless
# TWINBENCH_CLUSTER_INSTALL=0. Progress goes to stderr.
set -euo pipefail

SELF=$(readlink -f "${BASH_SOURCE[0]}")
REPO=$(cd "$(dirname "$SELF")/../.." && pwd -P)
SUBNET_PREFIX=10.213
IFACE=tb0           # every node's data interface: one name fits every launcher's interface option
LOCK=/run/lock/twinbench-cluster.lock
STOP_WAIT=10        # seconds a daemon gets between SIGTERM and SIGKILL

log() { printf '[cluster] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
usage() { sed -n 's|^#   \(tests/cluster/cluster.sh .*\)|usage: \1|p' "$SELF" >&2; exit 2; }

# -- state ----------------------------------------------------------------------------------------------------------
load() {  # DIR: the cluster's settings (cluster.env is this script's own KEY=VALUE file)
  [ -d "${1:-}" ] || die "no cluster directory '${1:-}'"
  DIR=$(cd "$1" && pwd -P)
  [ -f "$DIR/cluster.env" ] || die "$DIR holds no cluster (no cluster.env)"
  # shellcheck source=/dev/null
  source "$DIR/cluster.env"
}
members() { echo login; for ((k = 1; k <= NODES; k++)); do echo "node$k"; done; }
ns_name() { echo "$PREFIX-$1"; }
addr_of() { if [ "$1" = login ]; then echo "$NETBASE.1"; else echo "$NETBASE.$((10 + ${1#node}))"; fi; }
check_member() {  # NAME [nodes]: a node of this cluster, or login unless "nodes"
  if [ "$1" = login ] && [ "${2:-}" != nodes ]; then return 0; fi
  [[ $1 =~ ^node([1-9][0-9]*)$ ]] && [ "${BASH_REMATCH[1]}" -le "$NODES" ] && return 0
  if [ "${2:-}" = nodes ]; then die "'$1' is not a node of this cluster (node1..node$NODES)"; fi
  die "'$1' is not a member of this cluster (login, node1..node$NODES)"
}
record() { echo "$*" >>"$DIR/created"; }
elapsed() { local us=$(( ${EPOCHREALTIME/./} - ${1/./} )); printf '%d.%d' $((us / 1000000)) $((us / 100000 % 10)); }

netns_inode() { stat -L -c %i "/run/netns/$1" 2>/dev/null; }
pid_netns() { local l; l=$(readlink "/proc/$1/ns/net" 2>/dev/null) || return 1; l=${l#net:[}; echo "${l%]}"; }

# live_pid FILE: the PID in a pid file DIR/pids/MEMBER.COMM.pid if that process is still the one started, i.e. the
# same command name inside MEMBER's network namespace (inode recorded at creation); prints nothing otherwise.
live_pid() {
  local f=$1 base member comm pid
  base=$(basename "$f" .pid); member=${base%%.*}; comm=${base#*.}
  [ "$comm" = ns ] && comm=sleep
  pid=$(tr -dc 0-9 2>/dev/null <"$f" || true)
  [ -n "$pid" ] && [ -f "$DIR/ns/$member.inode" ] || return 0
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$comm" ] || return 0
  [ "$(pid_netns "$pid")" = "$(cat "$DIR/ns/$member.inode")" ] || return 0
  echo "$pid"
}
holder() {  # MEMBER: the PID of the process holding MEMBER's UTS and mount namespaces (fails if gone)
  local pid
  pid=$(live_pid "$DIR/pids/$1.ns.pid")
  [ -n "$pid" ] || die "$1 is not running (no live namespace holder; start the cluster, or stop and restart it)"
  echo "$pid"
}
host_cpus() {  # the CPUs this script may use (the host's, or what its own launcher left it), one per line
  local part
  for part in $(taskset -c -p $$ | sed 's/.*: //; s/,/ /g'); do seq "${part%-*}" "${part#*-}"; done
}
node_cpus() {  # nodeK: its share under `cpus split`, as a taskset list: common.cluster.placement.cpu_share's rule (tested)
  local k=${1#node} cpus n per
  mapfile -t cpus < <(host_cpus)
  n=${#cpus[@]}
  if [ "$n" -lt "$NODES" ]; then echo "${cpus[$(((k - 1) % n))]}"; return; fi
  per=$((n / NODES))
  local IFS=,; echo "${cpus[*]:$(((k - 1) * per)):$per}"
}
ns_cmd() {  # MEMBER: NSCMD=(the prefix that runs a command inside MEMBER's namespaces with the client environment)
  local pid pin=()
  pid=$(holder "$1")
  if [ "$1" != login ] && [ "$(cat "$DIR/run/cpus" 2>/dev/null)" = split ]; then pin=(taskset -c "$(node_cpus "$1")"); fi
  NSCMD=("${pin[@]}" nsenter --target "$pid" --net --uts --mount --wd="$(pwd -P)" --
         env SLURM_CONF="$DIR/etc/slurm.conf" TWINBENCH_CLUSTER_DIR="$DIR" TWINBENCH_CLUSTER_NODE="$1" HOSTNAME="$1")
}
in_ns() { ns_cmd "$1"; shift; "${NSCMD[@]}" "$@"; }

# -- start ----------------------------------------------------------------------------------------------------------
need_tools() {
  local missing=() t
  for t in ip tc nsenter unshare flock ssh ssh-keygen slurmctld slurmd srun sinfo scancel munged mknod; do
    command -v "$t" >/dev/null 2>&1 || missing+=("$t")
  done
  [ -x /usr/sbin/sshd ] || missing+=(sshd)
  echo "${missing[*]}"
}

free_net() {  # X: is 10.213.X.0/24 unused here (no namespaces of that name, no route or address in the subnet)?
  local x=$1 base="$SUBNET_PREFIX.$1"
  local names
  names=$(ip netns list 2>/dev/null || true)
  grep -q "^tb$x-" <<<"$names" && return 1
  [ -z "$(ip -4 route show table all root "$base.0/24")" ] || return 1
  [ -z "$(ip -4 route show table all match "$base.0/24" | grep -v '^default ')" ] || return 1
  [ -z "$(ip -4 addr show to "$base.0/24")" ] || return 1
  return 0
}

verb_start() {
  local nodes=2 cpus=2 gpus=2 net=""
  while [ $# -gt 1 ]; do
    case $1 in
      --nodes) nodes=$2; shift 2 ;;
      --cpus) cpus=$2; shift 2 ;;
      --gpus) gpus=$2; shift 2 ;;
      --net) net=$2; shift 2 ;;
      *) usage ;;
    esac
  done
  [ $# = 1 ] || usage
  [[ $nodes =~ ^[1-9][0-9]*$ ]] && [ "$nodes" -le 200 ] || die "--nodes must be 1..200, not '$nodes'"
  [[ $cpus =~ ^[1-9][0-9]*$ ]] || die "--cpus must be a positive number, not '$cpus'"
  [[ $gpus =~ ^[0-9]+$ ]] || die "--gpus must be a number, not '$gpus'"
  [ -z "$net" ] || { [[ $net =~ ^[0-9]+$ ]] && [ "$net" -le 255 ]; } || die "--net must be 0..255, not '$net'"
  [ "$(id -u)" = 0 ] || die "the emulated cluster needs root (namespaces, routes, daemons running as root)"

  local missing
  missing=$(need_tools)
  if [ -n "$missing" ]; then
    [ "${TWINBENCH_CLUSTER_INSTALL:-1}" = 1 ] \
      || die "missing $missing: run TWINBENCH_WITH_SLURM=1 make setup (TWINBENCH_CLUSTER_INSTALL=0: not installing)"
    log "missing $missing: installing with TWINBENCH_WITH_SLURM=1 scripts/setup.sh"
    TWINBENCH_WITH_SLURM=1 bash "$REPO/scripts/setup.sh" >&2 || die "scripts/setup.sh failed"
    missing=$(need_tools)
    [ -z "$missing" ] || die "still missing after the set-up: $missing"
  fi

  mkdir -p "$1"
  DIR=$(cd "$1" && pwd -P)
  [ ! -s "$DIR/created" ] || die "$DIR already holds a cluster (stop it first: $SELF stop $DIR)"
  if [ -f "$DIR/cluster.env" ]; then   # a stopped cluster of this script: start afresh
    rm -rf "$DIR"/{etc,ssh,ns,pids,run,log,nodes,dev,munge,munge-run,bin,state,cluster.env}
  elif [ -n "$(ls -A "$DIR")" ]; then
    die "$DIR is not empty: give a new or empty directory (or a stopped cluster's)"
  fi
  chmod 755 "$DIR"   # munged wants the directories on its socket path to be 0755 (mktemp -d makes 0700)
  # A Unix socket path holds at most 107 bytes.
  [ ${#DIR} -le 80 ] || die "DIR is too long for munged's socket path (${#DIR} > 80 characters): $DIR"
  mkdir -p "$DIR"/{etc,ssh,ns,pids,run,log,nodes,dev,bin,state,munge-run}
  mkdir -p -m 700 "$DIR/munge"
  : >"$DIR/created"
  trap 'rc=$?; if [ $rc != 0 ]; then log "start failed: cleaning up (logs stay in $DIR/log)"; stop_all || true; fi' EXIT

  # The guard comes first: from the moment the subnet is chosen, the root namespace cannot send a packet to it.
  local t0=$EPOCHREALTIME m sw
  exec 9>>"$LOCK"
  flock -w 30 9 || die "could not take $LOCK"
  if [ -n "$net" ]; then
    free_net "$net" || die "10.213.$net.0/24 or namespaces tb$net-* are in use here: choose another --net"
  else
    for ((net = 0; net <= 255; net++)); do free_net "$net" && break; done
    [ "$net" -le 255 ] || die "no free subnet in 10.213.0.0/16"
  fi
  NETBASE=$SUBNET_PREFIX.$net
  ip route add unreachable "$NETBASE.0/24"
  record "route $NETBASE.0/24"
  flock -u 9; exec 9>&-
  NODES=$nodes PREFIX=tb$net
  printf 'NODES=%q\nNETBASE=%q\nPREFIX=%q\nCPUS=%q\nGPUS=%q\nIFACE=%q\n' \
    "$NODES" "$NETBASE" "$PREFIX" "$cpus" "$gpus" "$IFACE" >"$DIR/cluster.env"

  make_network
  write_config "$cpus" "$gpus"
  for m in $(members); do start_holder "$m"; done
  for m in $(members); do wait_ready "$m"; done
  start_daemons
  wait_idle
  trap - EXIT
  sw=$(ns_name sw)
  log "up in $(elapsed "$t0") s: $NODES node(s) on $NETBASE.0/24 (interface $IFACE; switch namespace $sw)," \
      "$cpus CPUs and gpu:$gpus per node; run clients with: $SELF run $DIR login srun ..."
}

make_network() {
  local sw m ns
  sw=$(ns_name sw)
  ip netns add "$sw"; record "netns $sw"
  ip -n "$sw" link set lo up
  ip -n "$sw" link add br0 type bridge
  ip -n "$sw" link set br0 up
  for m in $(members); do
    ns=$(ns_name "$m")
    ip netns add "$ns"; record "netns $ns"
    netns_inode "$ns" >"$DIR/ns/$m.inode"
    # Both ends are made inside namespaces: the root namespace never holds an interface of the cluster.
    ip -n "$sw" link add "$m" type veth peer name "$IFACE" netns "$ns"
    ip -n "$sw" link set "$m" master br0 up
    ip -n "$ns" link set lo up
    ip -n "$ns" addr add "$(addr_of "$m")/24" dev "$IFACE"
    ip -n "$ns" link set "$IFACE" up
  done
  echo 'off' >"$DIR/run/shape"
  echo shared >"$DIR/run/cpus"
}

write_config() {  # CPUS GPUS
  local cpus=$1 gpus=$2 m k keyfile
  {
    echo "# twinbench emulated cluster ($DIR)"
    echo "127.0.0.1 localhost"
    echo "::1 localhost ip6-localhost ip6-loopback"
    for m in $(members); do echo "$(addr_of "$m") $m"; done
  } >"$DIR/etc/hosts"

  # ssh: a host key per node, one client key; known_hosts and authorized_keys made from them.
  ssh-keygen -q -t ed25519 -N '' -C twinbench-cluster -f "$DIR/ssh/id_ed25519"
  cp "$DIR/ssh/id_ed25519.pub" "$DIR/ssh/authorized_keys"
  : >"$DIR/ssh/known_hosts"
  for ((k = 1; k <= NODES; k++)); do
    m=node$k; mkdir -p "$DIR/nodes/$m"/{spool,tmp}
    chmod 1777 "$DIR/nodes/$m/tmp"
    keyfile=$DIR/nodes/$m/ssh_host_ed25519_key
    ssh-keygen -q -t ed25519 -N '' -C "$m" -f "$keyfile"
    echo "$m,$(addr_of "$m") $(cut -d' ' -f1,2 "$keyfile.pub")" >>"$DIR/ssh/known_hosts"
    cat >"$DIR/nodes/$m/sshd_config" <<EOF
ListenAddress $(addr_of "$m"):22
HostKey $keyfile
PidFile $DIR/pids/$m.sshd.pid
AuthorizedKeysFile $DIR/ssh/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PrintMotd no
PrintLastLog no
X11Forwarding no
MaxStartups 64
MaxSessions 64
EOF
  done
  cat >"$DIR/ssh/config" <<EOF
# ssh inside the emulated cluster ($SELF): this cluster's key and host keys only.
Host *
  User root
  IdentityFile $DIR/ssh/id_ed25519
  IdentitiesOnly yes
  UserKnownHostsFile $DIR/ssh/known_hosts
  GlobalKnownHostsFile /dev/null
  StrictHostKeyChecking yes
  CheckHostIP no
  BatchMode yes
  ConnectTimeout 5
  LogLevel ERROR
EOF
  # -F keeps ssh away from ~/.ssh entirely: without it, ssh reads ~/.ssh/config and creates ~/.ssh if missing.
  printf '#!/bin/sh\nexec %q -F %q "$@"\n' "$DIR/bin/ssh.real" "$DIR/ssh/config" >"$DIR/bin/ssh"
  chmod 755 "$DIR/bin/ssh"
  : >"$DIR/bin/ssh.real"   # mount point for the real ssh inside the namespaces

  # munge key; fake GPUs as character devices (Slurm rejects plain files, count-only gres drains the node)
  if command -v mungekey >/dev/null 2>&1; then
    mungekey --create --keyfile="$DIR/munge/munge.key" --force >&2
  else
    dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1 count=1024 status=none
  fi
  chmod 600 "$DIR/munge/munge.key"
  for ((k = 0; k < gpus; k++)); do mknod "$DIR/dev/nvidia$k" c 195 "$k"; done

  local gres="" conf=$DIR/etc/slurm.conf
  [ "$gpus" = 0 ] || gres=" Gres=gpu:$gpus"
  cat >"$conf" <<EOF
# twinbench emulated cluster (generated by tests/cluster/cluster.sh)
ClusterName=twinbench
SlurmctldHost=login($(addr_of login))
SlurmctldPort=6817
SlurmdPort=6818
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge-run/munge.socket.2
StateSaveLocation=$DIR/state
# %n: one spool, pid file, log and TmpFS per node; a shared pid file makes the second slurmd stop the first, and
# PMIx creates the same spmix_appdir path on every node.
SlurmdSpoolDir=$DIR/nodes/%n/spool
SlurmdPidFile=$DIR/pids/%n.slurmd.pid
SlurmdLogFile=$DIR/log/%n.slurmd.log
TmpFS=$DIR/nodes/%n/tmp
SlurmctldPidFile=$DIR/pids/login.slurmctld.pid
SlurmctldLogFile=$DIR/log/login.slurmctld.log
SlurmctldDebug=info
SlurmdDebug=info
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
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
SlurmdTimeout=30
EOF
  for ((k = 1; k <= NODES; k++)); do
    echo "NodeName=node$k NodeAddr=$(addr_of "node$k") CPUs=$cpus Boards=1 SocketsPerBoard=1" \
         "CoresPerSocket=$cpus ThreadsPerCore=1 RealMemory=4000$gres State=UNKNOWN" >>"$conf"
  done
  echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP" >>"$conf"
  : >"$DIR/etc/gres.conf"
  if [ "$gpus" != 0 ]; then
    for ((k = 1; k <= NODES; k++)); do
      echo "NodeName=node$k Name=gpu File=$DIR/dev/nvidia[0-$((gpus - 1))]" >>"$DIR/etc/gres.conf"
    done
  fi
}

start_holder() {  # MEMBER: a process in MEMBER's network namespace that owns its new UTS and mount namespaces
  local m=$1 ns
  ns=$(ns_name "$m")
  mkdir -p "$DIR/ns/$m.cgroup"
  # nsenter --net, not `ip netns exec`: the latter remounts /sys without the cgroup mounts, and slurmd 22.05 then
  # refuses to start. setsid: the holder must not die with the caller's terminal or process group.
  setsid nsenter --net="/run/netns/$ns" -- unshare --uts --mount --propagation private -- \
    bash "$SELF" _init "$DIR" "$m" </dev/null >>"$DIR/log/$m.ns.log" 2>&1 &
  echo $! >"$DIR/pids/$m.ns.pid"
}

init_member() {  # DIR MEMBER (inside the new namespaces): host name, /sys, /etc/hosts, ssh; then hold them
  DIR=$1; local m=$2
  hostname "$m"
  # /sys of this network namespace (so /sys/class/net shows tb0), with the cgroup mounts carried over
  mount --rbind /sys/fs/cgroup "$DIR/ns/$m.cgroup"
  mount -t sysfs sysfs /sys
  mount --move "$DIR/ns/$m.cgroup" /sys/fs/cgroup
  mount --bind "$DIR/etc/hosts" /etc/hosts
  mount --bind "$(readlink -f "$(command -v ssh)")" "$DIR/bin/ssh.real"
  mount --bind "$DIR/bin/ssh" "$(command -v ssh)"
  : >"$DIR/run/$m.ready"
  exec -a "twinbench-cluster $m $DIR" sleep infinity
}

wait_ready() {
  local m=$1
  for _ in $(seq 100); do
    [ -e "$DIR/run/$m.ready" ] && [ -n "$(live_pid "$DIR/pids/$m.ns.pid")" ] && return 0
    sleep 0.05
  done
  cat "$DIR/log/$m.ns.log" >&2 2>/dev/null || true
  die "the namespaces of $m did not come up (log above)"
}

daemon() {  # MEMBER NAME CMD...: start a daemonizing CMD inside MEMBER and wait for its pid file
  local m=$1 name=$2 pidfile
  shift 2
  pidfile=$DIR/pids/$m.$name.pid
  in_ns "$m" "$@" </dev/null >>"$DIR/log/$m.$name.out" 2>&1 \
    || { tail -n 20 "$DIR/log/$m.$name"* >&2 2>/dev/null || true; die "$name on $m did not start"; }
  for _ in $(seq 100); do
    [ -n "$(live_pid "$pidfile")" ] && return 0
    sleep 0.05
  done
  tail -n 20 "$DIR/log/$m.$name"* >&2 2>/dev/null || true
  die "$name on $m wrote no pid file $pidfile"
}

start_daemons() {
  local k m conf=$DIR/etc/slurm.conf sock=$DIR/munge-run/munge.socket.2
  # sshd's privilege separation directory is compiled in; Debian's service would create it at boot.
  [ -d /run/sshd ] || install -d -m 0755 /run/sshd
  daemon login munged munged --key-file="$DIR/munge/munge.key" --socket="$sock" \
    --pid-file="$DIR/pids/login.munged.pid" --log-file="$DIR/log/login.munged.log" \
    --seed-file="$DIR/munge/munged.seed" --force
  for _ in $(seq 50); do [ -S "$sock" ] && break; sleep 0.05; done
  daemon login slurmctld slurmctld -f "$conf" -c
  for ((k = 1; k <= NODES; k++)); do
    m=node$k
    daemon "$m" slurmd slurmd -f "$conf" -N "$m"
    daemon "$m" sshd /usr/sbin/sshd -f "$DIR/nodes/$m/sshd_config" -E "$DIR/log/$m.sshd.log"
  done
}

wait_idle() {
  local out="" want
  want=$(for ((k = 1; k <= NODES; k++)); do echo "node$k idle"; done)
  for _ in $(seq 300); do
    out=$(in_ns login sinfo -h -N -o '%N %T' 2>/dev/null | sort -V || true)
    [ "$out" = "$want" ] && return 0
    sleep 0.1
  done
  tail -n 20 "$DIR"/log/*slurm*.log >&2 2>/dev/null || true
  die "nodes not idle after 30 s: ${out:-no answer from slurmctld}"
}

# -- stop -----------------------------------------------------------------------------------------------------------
kill_recorded() {  # SIGTERM the recorded live daemons (holders last), SIGKILL what is left after STOP_WAIT s
  local f pid pids=()
  for f in "$DIR"/pids/*.pid; do
    [ -e "$f" ] || continue
    case $f in *.ns.pid) continue ;; esac
    pid=$(live_pid "$f")
    if [ -n "$pid" ]; then kill -TERM "$pid" 2>/dev/null && pids+=("$pid"); fi
  done
  wait_gone "${pids[@]}"
}

wait_gone() {  # PID...: wait up to STOP_WAIT s, then SIGKILL the rest
  local pid alive
  [ $# -gt 0 ] || return 0
  for _ in $(seq $((STOP_WAIT * 10))); do
    alive=0
    for pid in "$@"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && return 0
    sleep 0.1
  done
  for pid in "$@"; do
    if kill -0 "$pid" 2>/dev/null; then log "pid $pid did not stop: SIGKILL"; kill -KILL "$pid" 2>/dev/null || true; fi
  done
}

stop_all() {  # everything in DIR/created, in reverse; every step tolerates what is already gone
  local what arg m pid pids=() ns strays
  # Jobs first, so that Slurm ends their processes itself (slurmstepd outlives slurmd otherwise).
  if [ -f "$DIR/cluster.env" ] && [ -n "$(live_pid "$DIR/pids/login.slurmctld.pid" 2>/dev/null)" ]; then
    timeout 10 bash "$SELF" run "$DIR" login scancel --quiet --full --user=root >/dev/null 2>&1 || true
    for _ in $(seq 50); do
      [ -z "$(timeout 5 bash "$SELF" run "$DIR" login squeue -h 2>/dev/null || true)" ] && break
      sleep 0.2
    done
  fi
  kill_recorded
  # What is still inside this cluster's network namespaces can only have been started through this cluster (a job
  # step whose slurmd is gone, an ssh session): ending it is what frees the namespace.
  while read -r what arg; do
    [ "$what" = netns ] && [ -e "/run/netns/$arg" ] || continue
    strays=$(ip netns pids "$arg" 2>/dev/null || true)
    for pid in $strays; do
      if ! grep -qx "$pid" "$DIR"/pids/*.ns.pid 2>/dev/null; then
        log "ending pid $pid ($(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | cut -c1-80)) left in $arg"
        kill -TERM "$pid" 2>/dev/null && pids+=("$pid")
      fi
    done
  done <"$DIR/created"
  wait_gone "${pids[@]}"
  pids=()
  for f in "$DIR"/pids/*.ns.pid; do
    [ -e "$f" ] || continue
    pid=$(live_pid "$f")
    if [ -n "$pid" ]; then kill -TERM "$pid" 2>/dev/null && pids+=("$pid"); fi
  done
  wait_gone "${pids[@]}"
  tac "$DIR/created" | while read -r what arg; do
    case $what in
      netns) if [ -e "/run/netns/$arg" ]; then ip netns delete "$arg" || log "could not delete namespace $arg"; fi ;;
      route) if ip -4 route show table main exact "$arg" | grep -q '^unreachable '; then
               ip route del unreachable "$arg" || log "could not delete the route $arg"
             fi ;;
    esac
  done
  rm -f "$DIR"/pids/*.pid "$DIR"/run/*.ready
  : >"$DIR/created"
  for m in login $(for f in "$DIR"/nodes/*/; do [ -d "$f" ] && basename "$f"; done); do
    rm -f "$DIR/ns/$m.inode"
  done
}

verb_stop() {
  [ $# = 1 ] || usage
  [ -d "$1" ] || { log "no directory $1: nothing to stop"; return 0; }
  DIR=$(cd "$1" && pwd -P)
  if [ ! -s "$DIR/created" ]; then log "nothing running in $DIR"; return 0; fi
  [ "$(id -u)" = 0 ] || die "stop needs root"
  if [ -f "$DIR/cluster.env" ]; then
    # shellcheck source=/dev/null
    source "$DIR/cluster.env"
  fi
  stop_all
  log "stopped; logs in $DIR/log"
}

# -- links ----------------------------------------------------------------------------------------------------------
verb_shape() {  # DIR RATE|off
  [ $# = 2 ] || usage
  load "$1"
  local rate=$2 k ns num unit bps burst
  if [ "$rate" = off ]; then
    for ((k = 1; k <= NODES; k++)); do
      tc -n "$(ns_name "node$k")" qdisc del dev "$IFACE" root 2>/dev/null || true
    done
    echo off >"$DIR/run/shape"
    log "links unshaped"
    return 0
  fi
  [[ $rate =~ ^([0-9]+)(bit|kbit|mbit|gbit)$ ]] || die "RATE must look like 500kbit, 200mbit or 1gbit (or off)"
  num=${BASH_REMATCH[1]}; unit=${BASH_REMATCH[2]}
  case $unit in bit) bps=$num ;; kbit) bps=$((num * 1000)) ;; mbit) bps=$((num * 1000000)) ;;
                gbit) bps=$((num * 1000000000)) ;; esac
  [ "$bps" -gt 0 ] || die "RATE must be above zero"
  # Bucket: 4 ms at the rate, but at least 64 KiB so that one GSO packet of the veth always fits.
  burst=$((bps / 8 / 250)); [ "$burst" -ge 65536 ] || burst=65536
  for ((k = 1; k <= NODES; k++)); do
    ns=$(ns_name "node$k")
    tc -n "$ns" qdisc replace dev "$IFACE" root tbf rate "$rate" burst "$burst" latency 50ms
  done
  echo "$rate" >"$DIR/run/shape"
  log "every node's egress on $IFACE shaped to $rate (tbf, burst $burst bytes)"
}

verb_cpus() {  # DIR split|shared: every node on its own share of the CPUs, or all on all of them
  [ $# = 2 ] || usage
  load "$1"
  local mode=$2 k m f pid list
  case $mode in split | shared) ;; *) die "cpus takes split or shared, not '$mode'" ;; esac
  for ((k = 1; k <= NODES; k++)); do
    m=node$k
    if [ "$mode" = split ]; then list=$(node_cpus "$m"); else list=$(host_cpus | paste -sd,); fi
    for f in slurmd sshd; do
      pid=$(live_pid "$DIR/pids/$m.$f.pid")
      [ -n "$pid" ] || die "no live $f on $m"
      taskset -a -c -p "$list" "$pid" >/dev/null  # -a: every thread of the daemon
    done
    log "$m: CPUs $list"
  done
  echo "$mode" >"$DIR/run/cpus"
}

verb_cut() {  # DIR NODE: the switch port goes down; the node keeps its address, packets to and from it are lost
  [ $# = 2 ] || usage
  load "$1"; check_member "$2" nodes
  ip -n "$(ns_name sw)" link set "$2" down
  log "$2 cut off (switch port down)"
}

verb_heal() {  # DIR NODE
  [ $# = 2 ] || usage
  load "$1"; check_member "$2" nodes
  local pid
  ip -n "$(ns_name sw)" link set "$2" up
  # Slurm would take minutes to trust a node again that it marked not responding; SIGHUP makes slurmd re-register.
  pid=$(live_pid "$DIR/pids/$2.slurmd.pid")
  if [ -n "$pid" ]; then kill -HUP "$pid"; else log "warning: no live slurmd on $2"; fi
  log "$2 reconnected (slurmd re-registers)"
}

# -- run / status ---------------------------------------------------------------------------------------------------
verb_run() {  # DIR MEMBER CMD...
  [ $# -ge 3 ] || usage
  load "$1"; check_member "$2"
  ns_cmd "$2"
  shift 2
  exec "${NSCMD[@]}" "$@"
}

verb_status() {  # DIR: members, their processes and links, then Slurm's view; exit 1 if anything is down
  [ $# = 1 ] || usage
  load "$1"
  local m f name pid state ok=0 line
  echo "cluster $DIR: $NODES node(s), $NETBASE.0/24, interface $IFACE, shape $(cat "$DIR/run/shape" 2>/dev/null), cpus $(cat "$DIR/run/cpus" 2>/dev/null)"
  for m in $(members); do
    line="$m $(addr_of "$m")"
    for f in "$DIR/pids/$m".*.pid; do
      [ -e "$f" ] || continue
      name=$(basename "$f" .pid); name=${name#*.}
      pid=$(live_pid "$f")
      if [ -n "$pid" ]; then line+=" $name=$pid"; else line+=" $name=DEAD"; ok=1; fi
    done
    state=$(ip -n "$(ns_name sw)" -o link show "$m" 2>/dev/null | grep -o 'state [A-Z]*' || echo 'state MISSING')
    line+=" link:${state#state }"
    echo "$line"
  done
  if [ -n "$(live_pid "$DIR/pids/login.slurmctld.pid")" ]; then
    in_ns login timeout 10 sinfo -N -o '%N %T %c %G' || ok=1
  fi
  return $ok
}

case ${1:-} in
  start | stop | shape | cpus | cut | heal | run | status) verb=$1; shift; "verb_$verb" "$@" ;;
  _init) shift; init_member "$@" ;;
  *) usage ;;
esac
