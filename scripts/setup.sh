#!/usr/bin/env bash
# Idempotent set-up of everything twinbench needs on a Debian/Ubuntu machine (or CI):
#   system OpenMPI (for Horovod's MPI controller and mpirun), a venv in the repo root with
#   tensorflow + tf-keras + horovod (built from its sdist, patched for TF 2.19+ and GCC 13+, wheel cached outside the
#   repo) + test tools. Re-running it does nothing that is already done.
# Python 3.10-3.13 ($PYTHON, default python3; TensorFlow 2.21 has wheels for no other): anything else stops it with one
# line and exit 2 before anything is installed. What a stock Debian/Ubuntu lacks comes from apt-get: the compiler,
# cmake, patch, Open MPI, and python3.X-venv (Debian and Ubuntu ship venv's ensurepip separately; without it
# `python3 -m venv` fails with "ensurepip is not available").
# Variables:
#   TWINBENCH_TF=2.21      the default: requirements.txt, Horovod sdist + scripts/patches/horovod-0.28.1-tf2.19plus.patch
#   TWINBENCH_TF=2.18      the fallback: requirements-tf2.18.txt, the unpatched Horovod sdist
#   TWINBENCH_TF=2.17      a stand-in for the last NGC TensorFlow image's stack (25.02): requirements-tf2.17.txt,
#                          the unpatched Horovod sdist (make test-ngc)
#   TWINBENCH_TF=site      the TensorFlow 2.16-2.21 that $PYTHON (default python3; python with --horovod-only)
#                          already imports (a site module, an existing environment): scripts/site_tf.py checks it and
#                          its tf-keras (installs tf-keras~=X.Y.0 if missing) and picks the patches (2.19+ only); the
#                          venv is made with --system-site-packages so that it sees that TensorFlow
#   TWINBENCH_VENV=.venv   the venv; one holding another TensorFlow than the selected one is recreated
#   TWINBENCH_CACHE        Horovod wheels (keyed by Horovod, TF and Python versions and the patches) and the sdist;
#                          default ~/.cache/twinbench
#   TWINBENCH_WITH_SLURM=1 also Debian's slurm-wlm and munge (tests/test_slurm.py), and openssh-server and iproute2
#                          for the emulated multi-node cluster (tests/cluster/cluster.sh, tests/test_cluster.py)
#                          and chromium (headless: tests/test_report_stats.py renders report.html)
#   HOROVOD_GPU_OPERATIONS=NCCL (or any HOROVOD_GPU_* build variable): a GPU build; with TF 2.21 it also applies
#                          scripts/patches/horovod-0.28.1-tf2.21-gpu.patch (not compiled on the development machine)
#   TWINBENCH_STACK=as-is  use the TensorFlow + Horovod a container or a module already provides, nothing built or
#                          upgraded: $PYTHON (default python3) runs twinbench from this checkout (PYTHONPATH); the
#                          pure-Python packages it needs and the stack lacks (tf-keras of TensorFlow's minor,
#                          nvidia-ml-py) go beside it with pip --target into $TWINBENCH_STACK_DEPS (default
#                          .stack-deps in the checkout), never over it; then `python -m common.doctor --stack` says
#                          whether both backends can run (exit 2 when not). No Debian packages, no venv.
#   TWINBENCH_WITH_STACK_IMAGE=1  also build the test image (scripts/stack_image.sh: Debian 12 minbase + TensorFlow +
#                          the Horovod wheel, cached) that tests/test_stack_image.py runs both backends in; the
#                          default with TWINBENCH_WITH_SLURM=1 (make test), 0 skips it
# `scripts/setup.sh --horovod-only` builds and installs only Horovod (plus the build marker), into the Python
# environment already active (`python` on PATH, or $PYTHON), e.g. the cluster's conda environment: no Debian
# packages, no venv, no requirements. The environment's TensorFlow must be the selected one.
# After installing Horovod it writes <environment>/twinbench-build.json (common/core/buildinfo.py), which
# `python -m common.doctor` and the results JSONs' versions report.
set -euo pipefail
cd "$(dirname "$0")/.."

HOROVOD_VERSION=0.28.1     # last Horovod release (common/core/buildinfo.py HOROVOD_VERSION says the same)
HOROVOD_SDIST_SHA256=92a43f5a94c43907a56805bad15f19700c62ffc83b7ca483f9e104e229f67ef0  # PyPI's horovod-0.28.1.tar.gz
TB_TF=${TWINBENCH_TF:-2.21}
case "$TB_TF" in
  2.21) REQUIREMENTS=requirements.txt
        # 0.28.1 fails on TF 2.19+ only in xla_mpi_ops.cc's XLA includes, which CPU builds do not need
        PATCHES=(scripts/patches/horovod-0.28.1-tf2.19plus.patch) ;;
  2.18) REQUIREMENTS=requirements-tf2.18.txt
        PATCHES=() ;;      # TF 2.18 is the last that the unpatched 0.28.1 sdist builds against
  2.17) REQUIREMENTS=requirements-tf2.17.txt
        PATCHES=() ;;      # NGC 25.02's TensorFlow, which the unpatched sdist builds against too
  site) REQUIREMENTS=requirements.txt   # less its TensorFlow pins (scripts/site_tf.py requirements)
        PATCHES=() ;;      # scripts/site_tf.py detect decides them from the TensorFlow it finds
  *) printf '[setup] TWINBENCH_TF must be 2.21 (default), 2.18 (fallback), 2.17 (the NGC 25.02 stand-in) or site, not "%s"\n' "$TB_TF" >&2; exit 2 ;;
esac
# The pins live in the requirements file (tests/test_environment.py checks environment.yml and environment-build.yml
# against it).
TF_VERSION=$(sed -n 's/^tensorflow==\([0-9.]*\).*/\1/p' "$REQUIREMENTS")
TF_SOURCE="requirements:$REQUIREMENTS"
TF_LOCATION=""
TF_SITE_ID=""
TF_KERAS_INSTALL=""
PY=${PYTHON:-python3}
CACHE=${TWINBENCH_CACHE:-$HOME/.cache/twinbench}
VENV=${TWINBENCH_VENV:-.venv}
HOROVOD_ONLY=0
case "${1:-}" in
  "") ;;
  --horovod-only) HOROVOD_ONLY=1; PY=${PYTHON:-python} ;;
  *) printf 'usage: %s [--horovod-only]\n' "$0" >&2; exit 2 ;;
esac
# Horovod build flags (TensorFlow, Gloo and MPI; the HOROVOD_GPU_* variables of the caller pass through).
BUILD_ENV=(HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 HOROVOD_WITHOUT_PYTORCH=1
           HOROVOD_WITHOUT_MXNET=1 CMAKE_POLICY_VERSION_MINIMUM=3.5)
gpu_build=0
for v in HOROVOD_GPU_OPERATIONS HOROVOD_GPU_ALLREDUCE HOROVOD_GPU_ALLGATHER HOROVOD_GPU_BROADCAST \
         HOROVOD_GPU_ALLTOALL HOROVOD_GPU_REDUCESCATTER; do
  if [ -n "${!v:-}" ]; then gpu_build=1; fi
done
if [ "$TB_TF" != site ] && [ $gpu_build = 1 ] && [ ${#PATCHES[@]} -gt 0 ]; then
  PATCHES+=(scripts/patches/horovod-0.28.1-tf2.21-gpu.patch)   # inside HAVE_GPU: TF 2.21's XLA and stream API
fi

log() { printf '[setup] %s\n' "$*"; }

# TensorFlow 2.21's wheels are for CPython 3.10-3.13 (2.18's for 3.9-3.12) and twinbench needs 3.10+: another Python
# would fail half-way, after apt-get and pip, so it stops here.
command -v "$PY" >/dev/null 2>&1 \
  || { log "no $PY on PATH: install Python 3.10-3.13 (Debian/Ubuntu: apt-get install python3) or set PYTHON" >&2; exit 2; }
py_ver=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) \
  || { log "$PY does not run: set PYTHON to a Python 3.10-3.13" >&2; exit 2; }
case "$py_ver" in
  3.10|3.11|3.12|3.13) ;;
  *) log "$PY is Python $py_ver: twinbench needs 3.10-3.13 (TensorFlow 2.21's wheels); set PYTHON to one" >&2; exit 2 ;;
esac

case "${TWINBENCH_STACK:-}" in
  ""|build) ;;
  as-is)
    # The stack as it is: nothing compiled, nothing upgraded, nothing installed over it.
    PY=${PYTHON:-python3}
    command -v "$PY" >/dev/null 2>&1 || { log "TWINBENCH_STACK=as-is: no $PY on PATH (load the module, or set PYTHON)"; exit 2; }
    DEPS=${TWINBENCH_STACK_DEPS:-$PWD/.stack-deps}
    tf=$(TF_CPP_MIN_LOG_LEVEL=3 "$PY" -c 'import tensorflow as tf; print(tf.__version__)' 2>/dev/null) \
      || { log "TWINBENCH_STACK=as-is: $PY has no importable TensorFlow"; exit 2; }
    tf_minor=$(echo "$tf" | cut -d. -f1,2)
    need=(); optional=()   # tf-keras (and tomli on 3.10) are required; nvidia-ml-py only names the GPUs
    has() { PYTHONPATH="$DEPS${PYTHONPATH:+:$PYTHONPATH}" "$PY" -c "import $1" >/dev/null 2>&1; }
    has tf_keras || need+=("tf-keras~=$tf_minor.0")
    "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || has tomli \
      || need+=("$(sed -n 's/^\(tomli==[0-9.]*\).*/\1/p' requirements.txt)")
    has pynvml || optional+=("$(sed -n 's/^\(nvidia-ml-py==[0-9.]*\).*/\1/p' requirements.txt)")
    for req in ${need[@]+"${need[@]}"} ${optional[@]+"${optional[@]}"}; do
      log "TWINBENCH_STACK=as-is: installing $req beside the stack, into $DEPS"
      if ! "$PY" -m pip install -q --no-deps --target "$DEPS" "$req"; then
        case " ${need[*]:-} " in
          *" $req "*) log "pip could not install $req into $DEPS (no pip or no index in the stack?): install it there yourself"; exit 2 ;;
          *) log "skipped $req (pip could not install it): records will not name the GPU model and driver" ;;
        esac
      fi
    done
    status=0
    PYTHONPATH="$PWD:$DEPS${PYTHONPATH:+:$PYTHONPATH}" TF_CPP_MIN_LOG_LEVEL=3 "$PY" -m common.doctor --stack || status=$?
    log "run twinbench on this stack with: export PYTHONPATH=$PWD:$DEPS TF_USE_LEGACY_KERAS=1"
    exit $status ;;
  *) log "TWINBENCH_STACK must be as-is (use the stack that is there) or build (the default), not '${TWINBENCH_STACK}'"; exit 2 ;;
esac

if [ "$TB_TF" = site ]; then
  # The TensorFlow this Python imports decides the version, the tf-keras and the patches (one line and exit 2 when
  # it is not 2.16-2.21 or its tf-keras is another minor version).
  command -v "$PY" >/dev/null 2>&1 || { log "no $PY on PATH: load the site's TensorFlow module first (or set PYTHON)"; exit 2; }
  gpu_flag=(); if [ $gpu_build = 1 ]; then gpu_flag=(--gpu); fi
  site_err=$(mktemp "${TMPDIR:-/tmp}/twinbench-site-tf.XXXXXX")
  site_vars=$(TF_CPP_MIN_LOG_LEVEL=3 "$PY" scripts/site_tf.py detect "${gpu_flag[@]}" 2>"$site_err") \
    || { grep '^\[setup\]' "$site_err" >&2 || tail -n 1 "$site_err" >&2; rm -f "$site_err"; exit 2; }
  rm -f "$site_err"
  eval "$site_vars"
  TF_SOURCE=site
  log "site TensorFlow $TF_VERSION at $TF_LOCATION, tf-keras ${TF_KERAS_FOUND:-(none: installing $TF_KERAS_INSTALL)}," \
      "patches: ${PATCHES[*]:-none}"
fi

# GCC 13+ (Debian 13, Ubuntu 24.04, conda-forge's compilers) needs two includes the 0.28.1 sdist lacks (horovod#3957);
# harmless for older compilers, so every build carries it, whatever TWINBENCH_TF or site_tf.py selected.
PATCHES+=(scripts/patches/horovod-0.28.1-gcc13plus.patch)

if [ $HOROVOD_ONLY = 0 ]; then
  need_apt=()
  # Debian/Ubuntu's system Python lacks ensurepip until python3.X-venv is installed (a venv, pyenv or conda Python has it)
  if [ ! -x "$VENV/bin/python" ] && ! "$PY" -c 'import ensurepip' >/dev/null 2>&1; then
    need_apt+=("python$py_ver-venv")
  fi
  command -v mpirun >/dev/null 2>&1 || need_apt+=(openmpi-bin)
  [ -e /usr/include/x86_64-linux-gnu/openmpi ] || [ -e /usr/lib/x86_64-linux-gnu/openmpi/include ] \
    || dpkg -s libopenmpi-dev >/dev/null 2>&1 || need_apt+=(libopenmpi-dev)
  command -v cmake >/dev/null 2>&1 || need_apt+=(cmake)
  command -v g++ >/dev/null 2>&1 || need_apt+=(g++)
  command -v patch >/dev/null 2>&1 || need_apt+=(patch)
  if [ "${TWINBENCH_WITH_SLURM:-0}" = 1 ]; then
    command -v slurmctld >/dev/null 2>&1 || need_apt+=(slurm-wlm)
    command -v munged >/dev/null 2>&1 || need_apt+=(munge)
    # The emulated cluster runs one sshd per node (horovodrun and mpirun reach the other nodes over ssh) and builds
    # its nodes and links with ip and tc; ssh-keygen comes with openssh-client, a dependency of openssh-server.
    [ -x /usr/sbin/sshd ] || need_apt+=(openssh-server)
    { command -v ip >/dev/null 2>&1 && command -v tc >/dev/null 2>&1; } || need_apt+=(iproute2)
    # headless Chromium renders report.html in tests/test_report_stats.py (which fails without it under CI)
    command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
  fi
  if [ "$TB_TF" = site ] && [ ${#need_apt[@]} -gt 0 ]; then
    # A site's machines get compilers, cmake and MPI from its modules, not from apt-get: say what is missing.
    missing=()
    for tool in mpicxx cmake g++ patch; do command -v "$tool" >/dev/null 2>&1 || missing+=("$tool"); done
    if [ ${#missing[@]} -gt 0 ]; then
      log "TWINBENCH_TF=site installs no system packages: load modules that provide ${missing[*]}"; exit 2
    fi
    need_apt=()
  fi
  if [ ${#need_apt[@]} -gt 0 ]; then
    log "installing Debian packages: ${need_apt[*]}"
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
    policy=/usr/sbin/policy-rc.d; made_policy=0
    if [ "${TWINBENCH_WITH_SLURM:-0}" = 1 ] && [ ! -e "$policy" ]; then
      # Keep the maintainer scripts from starting system munge/slurmctld/slurmd/sshd (init.d or systemd, which may
      # be absent): the tests start their own, in a temporary directory (tests/slurm/start_cluster.sh,
      # tests/cluster/cluster.sh).
      printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null && $SUDO chmod 755 "$policy" && made_policy=1
    fi
    apt_status=0
    $SUDO apt-get update -qq || apt_status=$?
    [ $apt_status != 0 ] || $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null \
      || apt_status=$?
    if [ $made_policy = 1 ]; then $SUDO rm -f "$policy"; fi
    [ $apt_status = 0 ] || { log "apt-get failed (status $apt_status)"; exit $apt_status; }
  fi

  # A venv holding another TensorFlow than the selected one is recreated: upgrading TF in place would leave the
  # other version's dependencies behind, and its Horovod is compiled against the old TF.
  if [ -x "$VENV/bin/python" ]; then
    have_tf=$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("tensorflow"))' 2>/dev/null || true)
    if [ "$TB_TF" = site ] && ! grep -qx 'include-system-site-packages = true' "$VENV/pyvenv.cfg" 2>/dev/null; then
      have_tf="its own"   # a venv of its own TensorFlow, not one that sees the site's
    fi
    if [ -n "$have_tf" ] && [ "$have_tf" != "$TF_VERSION" ]; then
      if [ ! -f "$VENV/pyvenv.cfg" ]; then
        log "$VENV has tensorflow $have_tf, not $TF_VERSION, and is no venv (no pyvenv.cfg): not touching it"
        exit 1
      fi
      log "$VENV has tensorflow $have_tf, not $TF_VERSION (TWINBENCH_TF=$TB_TF): recreating it"
      rm -rf -- "$VENV"
    fi
  fi
  if [ ! -x "$VENV/bin/python" ]; then
    log "creating $VENV"
    if [ "$TB_TF" = site ]; then "$PY" -m venv --system-site-packages "$VENV"; else "$PY" -m venv "$VENV"; fi
  fi
  VPY="$VENV/bin/python"
  "$VPY" -m pip install -q --upgrade pip >/dev/null

  # Python packages (pinned where it matters for parity; environment.yml and environment-build.yml are the cluster twins).
  if [ "$TB_TF" = site ]; then
    site_req=$(mktemp "${TMPDIR:-/tmp}/twinbench-req.XXXXXX")
    "$VPY" scripts/site_tf.py requirements "$REQUIREMENTS" --tf-version "$TF_VERSION" >"$site_req"
    "$VPY" -m pip install -q -r "$site_req"; rm -f "$site_req"
    if [ -n "$TF_KERAS_INSTALL" ]; then "$VPY" -m pip install -q "$TF_KERAS_INSTALL"; fi
  else
    "$VPY" -m pip install -q -r "$REQUIREMENTS"
  fi
else
  VPY=$(command -v "$PY") || { log "no $PY on PATH: activate the environment first (or set PYTHON)"; exit 1; }
  command -v patch >/dev/null 2>&1 || [ ${#PATCHES[@]} = 0 ] || { log "patch(1) is needed to patch the Horovod sdist"; exit 1; }
  if [ -n "$TF_KERAS_INSTALL" ]; then "$VPY" -m pip install -q "$TF_KERAS_INSTALL"; fi
  have_tf=$("$VPY" -c 'import tensorflow as tf; print(tf.__version__)' 2>/dev/null || true)
  if [ "$have_tf" != "$TF_VERSION" ]; then
    log "$VPY has tensorflow ${have_tf:-(none)}, not $TF_VERSION (TWINBENCH_TF=$TB_TF, $REQUIREMENTS)"
    exit 1
  fi
fi

# Horovod: compiled against the installed TF, so the cached wheel is keyed by the Horovod, TF and Python versions,
# the sha256 of the patches applied, and GPU or not.
pytag=$("$VPY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
patch_ids=()
patch_args=()
for p in "${PATCHES[@]}"; do
  patch_ids+=("$(sha256sum "$p" | cut -c1-12)")
  patch_args+=(--patch "$p")
done
# TWINBENCH_HOROVOD_GLOO=0: Horovod without Gloo, MPI controller only, as conda-forge builds it
# (HOROVOD_WITHOUT_GLOO=1): what `make test-nogloo` runs twinbench's own launches on, in an environment of its own.
nogloo=0
if [ "${TWINBENCH_HOROVOD_GLOO:-1}" = 0 ]; then
  nogloo=1
  BUILD_ENV=("${BUILD_ENV[@]/#HOROVOD_WITH_GLOO=1/HOROVOD_WITHOUT_GLOO=1}")
fi
build_id="horovod-$HOROVOD_VERSION-tf$TF_VERSION-$pytag"
if [ -n "$TF_SITE_ID" ]; then build_id+="-site$TF_SITE_ID"; fi   # a site's build of that version: its own wheel
if [ ${#patch_ids[@]} -gt 0 ]; then build_id+="-p$(IFS=-; echo "${patch_ids[*]}")"; fi
if [ $gpu_build = 1 ]; then build_id+="-gpu"; fi
if [ $nogloo = 1 ]; then build_id+="-nogloo"; fi
wheeldir="$CACHE/$build_id"

foreign_hvd=""
# (a Gloo-less build's environment sees the main one's Horovod beneath its own: never "already there")
if { [ $HOROVOD_ONLY = 1 ] || [ "$TB_TF" = site ]; } && [ "${TWINBENCH_REBUILD_HOROVOD:-0}" != 1 ] && [ $nogloo = 0 ] \
   && ! "$VPY" -m common.core.buildinfo check "$build_id" >/dev/null 2>&1; then
  # A Horovod the environment already has (a site module's, a container's) and that works is never replaced.
  foreign_hvd=$("$VPY" -c 'import horovod, horovod.tensorflow as h
print(horovod.__version__) if (h.gloo_built() or h.mpi_built()) else None' 2>/dev/null | grep -v '^None$' || true)
fi
if [ -n "$foreign_hvd" ]; then
  log "horovod $foreign_hvd is already there and works (not built by twinbench): kept, nothing built" \
      "(TWINBENCH_REBUILD_HOROVOD=1 replaces it)"
elif "$VPY" -m common.core.buildinfo check "$build_id" >/dev/null 2>&1 && "$VPY" -c "import horovod.tensorflow" >/dev/null 2>&1
then
  log "horovod $HOROVOD_VERSION already built as $build_id"
else
  if [ $gpu_build = 1 ]; then
    # TensorFlow 2.21's XLA headers (compiled in GPU builds only) include HighwayHash and FarmHash relative to
    # their external repositories, which the wheel ships but tf.sysconfig does not report (as conda-forge does).
    tfinc=$("$VPY" -c 'import importlib.util as u; print(u.find_spec("tensorflow").submodule_search_locations[0])')/include
    extra=""
    for d in "$tfinc/external/highwayhash" "$tfinc/external/farmhash_archive/src"; do
      if [ -d "$d" ]; then extra+=" -I$d"; fi
    done
    if [ -n "$extra" ]; then BUILD_ENV+=("CXXFLAGS=${CXXFLAGS:-}$extra"); fi
  fi
  if ! ls "$wheeldir"/horovod-*.whl >/dev/null 2>&1; then
    sdist="$CACHE/sdist/horovod-$HOROVOD_VERSION.tar.gz"
    if [ ! -f "$sdist" ]; then
      mkdir -p "$CACHE/sdist"
      "$VPY" -m pip download -q --no-deps --no-binary :all: -d "$CACHE/sdist" "horovod==$HOROVOD_VERSION"
    fi
    if ! echo "$HOROVOD_SDIST_SHA256  $sdist" | sha256sum -c --quiet - >/dev/null 2>&1; then
      log "$sdist is not PyPI's horovod $HOROVOD_VERSION sdist (sha256 differs): remove it and re-run"
      exit 1
    fi
    src=$(mktemp -d "${TMPDIR:-/tmp}/twinbench-horovod.XXXXXX")
    trap 'rm -rf "$src"' EXIT
    tar xzf "$sdist" -C "$src"
    srcdir="$src/horovod-$HOROVOD_VERSION"
    for p in "${PATCHES[@]}"; do
      log "patching the horovod sdist: $p"
      patch -d "$srcdir" -p1 --batch --forward --silent <"$p" || { log "$p does not apply"; exit 1; }
    done
    log "building horovod $HOROVOD_VERSION from its sdist (2-5 min on 2 cores) into $wheeldir"
    rm -rf "$wheeldir.tmp"; mkdir -p "$wheeldir.tmp"
    # --no-build-isolation: the sdist has no pyproject and must see the environment's TensorFlow.
    env "${BUILD_ENV[@]}" MAKEFLAGS="-j$(nproc)" \
      "$VPY" -m pip wheel -q --no-build-isolation --no-deps -w "$wheeldir.tmp" "$srcdir"
    rm -rf "$wheeldir"; mv "$wheeldir.tmp" "$wheeldir"   # only a finished build lands in the cache
    rm -rf "$src"; trap - EXIT
  else
    log "using cached horovod wheel in $wheeldir"
  fi
  whl=$(ls "$wheeldir"/horovod-*.whl | head -n 1)
  # --force-reinstall: an installed horovod of the same version may be one built against another TF or patch.
  # A Gloo-less build goes into its own environment's site-packages (--ignore-installed: the main environment's
  # Horovod, which that environment also sees, is shadowed, never uninstalled).
  if [ $nogloo = 1 ]; then reinstall=--ignore-installed; else reinstall=--force-reinstall; fi
  "$VPY" -m pip install -q --no-deps "$reinstall" "$whl"
  # horovod's own runtime deps (not pulled with --no-deps)
  "$VPY" -m pip install -q cloudpickle psutil pyyaml packaging cffi
  env "${BUILD_ENV[@]}" "$VPY" -m common.core.buildinfo write --build-id "$build_id" "${patch_args[@]}" --wheel "$whl" \
    --sdist-sha256 "$HOROVOD_SDIST_SHA256" --tf-source "$TF_SOURCE" \
    --tf-version "$TF_VERSION" --tf-location "$TF_LOCATION" >/dev/null
fi
# The test image (tests/test_stack_image.py, tests/test_slurm_stack.py): with the tests' set-up (TWINBENCH_WITH_SLURM=1,
# as make test sets it) or when asked; it needs root, as the test Slurm does.
if [ "${TWINBENCH_WITH_STACK_IMAGE:-${TWINBENCH_WITH_SLURM:-0}}" = 1 ] && [ $HOROVOD_ONLY = 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    TWINBENCH_VENV=$VENV bash scripts/stack_image.sh >/dev/null   # cached after the first build (about 2 minutes)
  else
    log "the stack test image needs root (debootstrap, chroot): not built"
  fi
fi
log "ok: $("$VPY" -c 'import tensorflow as tf, tf_keras, horovod
print("tensorflow", tf.__version__, "tf-keras", tf_keras.__version__, "horovod", horovod.__version__)' 2>/dev/null)," \
  "horovod patch: $("$VPY" -c 'from common.core import buildinfo; print(buildinfo.horovod_patch_description())')" \
  "($( [ $HOROVOD_ONLY = 1 ] && echo "$VPY" || echo "$VENV"), TWINBENCH_TF=$TB_TF)"
