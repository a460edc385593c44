#!/usr/bin/env bash
# Builds, once, a container image the way a centre's is built, for the tests that run twinbench inside a stack it did
# not install (tests/test_stack_image.py) and for trying the container launch mode by hand:
#   debootstrap --variant=minbase bookworm, then (by chroot, as root) Debian's python3 and OpenMPI, and in /opt/stack
#   a venv with TensorFlow + tf-keras (+ Keras 3, TensorFlow's own dependency) from PyPI at requirements.txt's pins
#   and the Horovod wheel the set-up built (~/.cache/twinbench/horovod-*/): no TensorBoard, no twinbench (the
#   checkout is bound in at run time), mount points for the checkout's path and /mnt/0-9 (Charliecloud's convention) for binds.
# Run it with `ch-run IMAGE -- /opt/stack/bin/python ...` (Charliecloud 0.31: Debian's charliecloud package).
# Prints the image directory on its last line; `--path` only prints it (exit 1 when it is not built yet). Cached: a finished image is never rebuilt (the directory name
# holds the Debian release, TensorFlow's version and the Horovod build id); an unfinished one is started again.
# `--no-hosts` prints (making it once) a hard-linked copy of the built image without /etc/hosts: ch-run then binds
# none, and no name resolves inside (neither the host's own nor localhost), as in an image built without one.
# Variables: TWINBENCH_CACHE (default ~/.cache/twinbench), TWINBENCH_VENV (.venv: its pip downloads the wheels,
# through the same indexes as the set-up), DEBIAN_MIRROR (default: the host's Debian mirror, else deb.debian.org).
# Needs root (debootstrap, chroot) and debootstrap + ch-run: installed with apt-get when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in ""|--path|--no-hosts) ;; *) printf 'usage: %s [--path|--no-hosts]\n' "$0" >&2; exit 2 ;; esac
log() { printf '[stack-image] %s\n' "$*" >&2; }

CACHE=${TWINBENCH_CACHE:-$HOME/.cache/twinbench}
VPY=${TWINBENCH_VENV:-.venv}/bin/python
SUITE=bookworm
TF_VERSION=$(sed -n 's/^tensorflow==\([0-9.]*\).*/\1/p' requirements.txt)
TFK_VERSION=$(sed -n 's/^tf-keras==\([0-9.]*\).*/\1/p' requirements.txt)
[ -x "$VPY" ] || { log "no $VPY: run make setup first (it builds the Horovod wheel the image gets)"; exit 2; }
pytag=$("$VPY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
# the CPU build the set-up made for this TensorFlow and Python and installed in the venv (its build marker names it;
# an older cached build of other patches, a -gpu, -site or -nogloo build is another stack)
build_id=$("$VPY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["build_id"])' \
  "$(dirname "$(dirname "$VPY")")/twinbench-build.json" 2>/dev/null || true)
case "$build_id" in
  horovod-*-tf"$TF_VERSION"-"$pytag"-p*) ;;
  *) build_id="" ;;
esac
wheeldir=${build_id:+$CACHE/$build_id}
whl=$(ls "$wheeldir"/horovod-*.whl 2>/dev/null | head -n 1 || true)
[ -n "$whl" ] || { log "no Horovod wheel for TensorFlow $TF_VERSION ($pytag) in $CACHE: run make setup first"; exit 2; }
img="$CACHE/images/stack-$SUITE-tf$TF_VERSION-$(basename "$wheeldir")"
if [ "${1:-}" = --no-hosts ] && [ -x "$img/opt/stack/bin/python" ]; then
  bare="$img-nohosts"
  if [ ! -x "$bare/opt/stack/bin/python" ]; then
    rm -rf "$bare.tmp"
    cp -al "$img" "$bare.tmp"  # new directories, the same files: seconds, and no space
    rm -f "$bare.tmp/etc/hosts"  # unlinks the copy's name only
    mv "$bare.tmp" "$bare"
  fi
  mkdir -p "$bare$PWD"
  log "cached: $bare"
  echo "$bare"
  exit 0
fi
if [ -x "$img/opt/stack/bin/python" ]; then
  # ch-run binds onto existing directories only (the image is read-only): the checkout's path, as a site's image
  # has its file systems' mount points
  mkdir -p "$img$PWD"
  log "cached: $img"
  echo "$img"
  exit 0
fi
[ -z "${1:-}" ] || { log "not built yet: bash scripts/stack_image.sh builds it"; exit 1; }

[ "$(id -u)" = 0 ] || { log "needs root (debootstrap and chroot)"; exit 2; }
need=()
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
command -v ch-run >/dev/null 2>&1 || need+=(charliecloud)
if [ ${#need[@]} -gt 0 ]; then
  log "installing Debian packages: ${need[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
mirror=${DEBIAN_MIRROR:-$(sed -n 's/^URIs: *\(http[^ ]*debian\)$/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null \
  | head -n 1)}
mirror=${mirror:-http://deb.debian.org/debian}

t0=$(date +%s)
tmp="$img.tmp"
umount "$tmp/proc" 2>/dev/null || true
rm -rf "$tmp"
mkdir -p "$tmp"
cleanup() { umount "$tmp/proc" 2>/dev/null || true; }
trap cleanup EXIT
log "debootstrap --variant=minbase $SUITE from $mirror (about 2.5 min)"
debootstrap --variant=minbase "$SUITE" "$tmp" "$mirror" >"$CACHE/images/debootstrap.log" 2>&1 \
  || { log "debootstrap failed: $CACHE/images/debootstrap.log"; tail -n 5 "$CACHE/images/debootstrap.log" >&2; exit 1; }
t1=$(date +%s)

# The wheels, downloaded on the host through the set-up's pip (its indexes and cache), installed offline inside.
wheels="$CACHE/images/wheels-tf$TF_VERSION-$pytag"
log "pip download tensorflow==$TF_VERSION tf-keras==$TFK_VERSION (+ Horovod's runtime dependencies) into $wheels"
"$VPY" -m pip download -q -d "$wheels" "tensorflow==$TF_VERSION" "tf-keras==$TFK_VERSION" \
  cloudpickle psutil pyyaml packaging cffi

cp /etc/resolv.conf "$tmp/etc/resolv.conf"
mount -t proc proc "$tmp/proc"
log "chroot: apt-get install python3 python3-venv openmpi-bin"
chroot "$tmp" apt-get update -qq
chroot "$tmp" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
  python3 python3-venv openmpi-bin libopenmpi3 ca-certificates >/dev/null
log "chroot: /opt/stack venv with TensorFlow $TF_VERSION, tf-keras $TFK_VERSION and $(basename "$whl")"
mkdir -p "$tmp/tmp/wheels"
cp "$wheels"/*.whl "$whl" "$tmp/tmp/wheels/"
chroot "$tmp" python3 -m venv /opt/stack
chroot "$tmp" /opt/stack/bin/python -m pip install -q --no-index --find-links /tmp/wheels \
  "tensorflow==$TF_VERSION" "tf-keras==$TFK_VERSION" cloudpickle psutil pyyaml packaging cffi
chroot "$tmp" /opt/stack/bin/python -m pip install -q --no-index --no-deps "/tmp/wheels/$(basename "$whl")"
rm -rf "$tmp/tmp/wheels" "$tmp/var/lib/apt/lists/"* "$tmp/var/cache/apt/archives/"*.deb "$tmp/root/.cache"
# Mount points for binds: the checkout's path; /mnt/0-9 as Charliecloud's own images have them.
mkdir -p "$tmp$PWD" "$tmp"/mnt/{0,1,2,3,4,5,6,7,8,9}
# ch-run binds the host's /etc/hosts and /etc/resolv.conf onto files the image has (as ch-image's images do):
# minbase has no /etc/hosts, and horovodrun must resolve localhost
: >"$tmp/etc/hosts"
umount "$tmp/proc"
trap - EXIT
mv "$tmp" "$img"
log "built in $(( $(date +%s) - t0 )) s (debootstrap $(( t1 - t0 )) s): $img ($(du -sh "$img" | cut -f1))"
echo "$img"
