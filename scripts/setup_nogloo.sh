#!/usr/bin/env bash
# .venv-nogloo: the main environment's TensorFlow (its site-packages added by a .pth, read after this environment's
# own) with a Horovod built without Gloo, MPI controller only, as conda-forge builds it (scripts/setup.sh with
# TWINBENCH_HOROVOD_GLOO=0; wheel cached in ~/.cache/twinbench/ under a "-nogloo" build id). Idempotent; run by
# `make test-nogloo` after `make setup`.
set -euo pipefail
cd "$(dirname "$0")/.."
MAIN=${TWINBENCH_VENV:-.venv}
NOGLOO=${TWINBENCH_NOGLOO_VENV:-.venv-nogloo}
log() { printf '[setup] %s\n' "$*"; }
[ -x "$MAIN/bin/python" ] || { log "$MAIN has no python: run make setup first"; exit 1; }
if [ ! -x "$NOGLOO/bin/python" ]; then
  log "creating $NOGLOO on top of $MAIN"
  "$MAIN/bin/python" -m venv --without-pip "$NOGLOO"   # pip, TensorFlow and the rest come from $MAIN
fi
main_site=$("$MAIN/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
own_site=$("$NOGLOO/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
# addsitedir (not a bare path): the main site-packages' own .pth files apply too, and it comes after this one's
printf 'import site; site.addsitedir(%s)\n' "'$main_site'" > "$own_site/twinbench-main-venv.pth"
PYTHON="$PWD/$NOGLOO/bin/python" TWINBENCH_HOROVOD_GLOO=0 bash scripts/setup.sh --horovod-only
