#!/usr/bin/env bash
# Idempotent set-up of everything twinbench needs on a Debian/Ubuntu machine (or CI):
#   system OpenMPI (for Horovod's MPI controller and mpirun), a .venv in the repo root with
#   tensorflow + tf-keras + horovod (built from its sdist, wheel cached outside the repo) + test tools.
# Re-running it does nothing that is already done. Override the cache with TWINBENCH_CACHE.
set -euo pipefail
cd "$(dirname "$0")/.."

TF_VERSION=2.18.1          # last TF that Horovod 0.28.1 builds against (2.19+ fail in xla_mpi_ops.cc)
TF_KERAS_VERSION=2.18.0    # legacy Keras 2, matching TF; Keras 3 breaks MWMS fit and Horovod averaging
HOROVOD_VERSION=0.28.1     # last Horovod release
PY=${PYTHON:-python3}
CACHE=${TWINBENCH_CACHE:-$HOME/.cache/twinbench}
VENV=.venv

log() { printf '[setup] %s\n' "$*"; }

need_apt=()
command -v mpirun >/dev/null 2>&1 || need_apt+=(openmpi-bin)
[ -e /usr/include/x86_64-linux-gnu/openmpi ] || [ -e /usr/lib/x86_64-linux-gnu/openmpi/include ] \
  || dpkg -s libopenmpi-dev >/dev/null 2>&1 || need_apt+=(libopenmpi-dev)
command -v cmake >/dev/null 2>&1 || need_apt+=(cmake)
command -v g++ >/dev/null 2>&1 || need_apt+=(g++)
if [ "${TWINBENCH_WITH_SLURM:-0}" = 1 ]; then
  command -v slurmctld >/dev/null 2>&1 || need_apt+=(slurm-wlm)
  command -v munged >/dev/null 2>&1 || need_apt+=(munge)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  log "installing Debian packages: ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  policy=/usr/sbin/policy-rc.d; made_policy=0
  if [ "${TWINBENCH_WITH_SLURM:-0}" = 1 ] && [ ! -e "$policy" ]; then
    # Keep the maintainer scripts from starting system munge/slurmctld/slurmd (init.d or systemd, which may be
    # absent): the tests start their own, in a temporary directory (tests/slurm/start_cluster.sh).
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null && $SUDO chmod 755 "$policy" && made_policy=1
  fi
  apt_status=0
  $SUDO apt-get update -qq || apt_status=$?
  [ $apt_status != 0 ] || $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null \
    || apt_status=$?
  if [ $made_policy = 1 ]; then $SUDO rm -f "$policy"; fi
  [ $apt_status = 0 ] || { log "apt-get failed (status $apt_status)"; exit $apt_status; }
fi

if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV"
  "$PY" -m venv "$VENV"
fi
VPY="$VENV/bin/python"
"$VPY" -m pip install -q --upgrade pip >/dev/null

# Python packages (pinned where it matters for parity; see environment.yml for the cluster twin).
"$VPY" -m pip install -q -r requirements.txt

# Horovod: compiled against the installed TF, so the cached wheel is keyed by TF and Python versions.
if ! "$VPY" -c "import horovod.tensorflow" >/dev/null 2>&1; then
  pytag=$("$VPY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
  wheeldir="$CACHE/horovod-$HOROVOD_VERSION-tf$TF_VERSION-$pytag"
  if ! ls "$wheeldir"/horovod-*.whl >/dev/null 2>&1; then
    log "building horovod $HOROVOD_VERSION from source (3-5 min on 2 cores) into $wheeldir"
    mkdir -p "$wheeldir.tmp"
    # --no-build-isolation: the sdist has no pyproject and must see the venv's TensorFlow.
    HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 \
    HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
    CMAKE_POLICY_VERSION_MINIMUM=3.5 MAKEFLAGS="-j$(nproc)" \
      "$VPY" -m pip wheel -q --no-build-isolation --no-deps -w "$wheeldir.tmp" "horovod==$HOROVOD_VERSION"
    rm -rf "$wheeldir"; mv "$wheeldir.tmp" "$wheeldir"   # only a finished build lands in the cache
  else
    log "using cached horovod wheel in $wheeldir"
  fi
  "$VPY" -m pip install -q --no-deps "$wheeldir"/horovod-*.whl
  # horovod's own runtime deps (not pulled with --no-deps)
  "$VPY" -m pip install -q cloudpickle psutil pyyaml packaging cffi
fi
log "ok: $("$VPY" -c 'import tensorflow as tf, horovod; print("tensorflow", tf.__version__, "horovod", horovod.__version__)' 2>/dev/null)"
