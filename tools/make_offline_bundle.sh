#!/usr/bin/env bash
# Write every wheel an offline Python 3.12 GPU machine needs (tools/offline_bundle.txt:
# VISSL, Classy Vision, fvcore, iopath, Hydra, OmegaConf, antlr4, submitit, setuptools 80,
# matplotlib, ...; no torch) into BUNDLE (default offline_bundle/, git-ignored), building the
# packages published only as source (antlr4-python3-runtime, fvcore, ...) into wheels, plus a
# copy of the Fashion-MNIST files for the demo.  Run it on a machine with network access.
# usage: tools/make_offline_bundle.sh [BUNDLE]      (PY=python3.12 by default: the target's Python)
set -euo pipefail
cd "$(dirname "$0")/.."
BUNDLE=${1:-offline_bundle}
PY=${PY:-}
if [ -z "$PY" ]; then
  if command -v python3.12 >/dev/null; then PY=python3.12
  else PY=$(ls -d "$HOME"/.pyenv/versions/3.12*/bin/python 2>/dev/null | tail -1)
  fi
fi
[ -n "$PY" ] && "$PY" -c 'import sys; assert sys.version_info[:2] == (3, 12)' \
  || { echo "make_offline_bundle: needs a Python 3.12 (set PY=/path/to/python3.12)" >&2; exit 2; }
mkdir -p "$BUNDLE"
# --no-deps: exactly the pinned list; binary packages come as cp312 wheels, sdists are built here
grep -v '^\s*#' tools/offline_bundle.txt | grep -v '^\s*$' \
  | xargs "$PY" -m pip wheel -q --no-deps -w "$BUNDLE"
FM=${FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
if [ -f "$FM/train-images-idx3-ubyte.gz" ]; then
  mkdir -p "$BUNDLE/fashion-mnist"
  cp "$FM"/*-ubyte.gz "$BUNDLE/fashion-mnist/"
else
  echo "make_offline_bundle: warning: no Fashion-MNIST in $FM (the demo section will need it)" >&2
fi
n=$(ls "$BUNDLE"/*.whl | wc -l)
# a lent GPU machine may take at most 64 MiB of working tree and carried folders together
mb=$(du -sm "$BUNDLE" | cut -f1)
[ "$mb" -le 60 ] || echo "make_offline_bundle: warning: $BUNDLE is $mb MiB (a 64 MiB transfer limit leaves little room)" >&2
echo "offline bundle: $n wheels in $BUNDLE ($(du -sh "$BUNDLE" | cut -f1)); install with tools/install_offline.sh $BUNDLE"
