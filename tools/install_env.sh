#!/usr/bin/env bash
# Create (or update) the project's virtual environment on a bare machine.
# usage: tools/install_env.sh PYTHON VENV
set -euo pipefail
PY=${1:-python3.11}
VENV=${2:-.venv}
cd "$(dirname "$0")/.."
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP="$VENV/bin/python -m pip"
$PIP install -q --upgrade pip wheel
# torch/torchvision: on these machines pip takes both from local disk (no download).
$VENV/bin/python -c "import torch, torchvision; assert torch.__version__.startswith('2.14.1')" 2>/dev/null \
  || $PIP install -q torch==2.14.1 torchvision==0.29.1
# Our requirements next, while VISSL is not installed yet: pip checks the dependencies of the
# packages an install touches and of those depending on them, so installing them after VISSL
# would print an ERROR block for VISSL 0.1.6's pins (numpy==1.19.5, hydra-core==1.0.7, ...,
# which cannot install on Python 3.11).  On a re-run VISSL is there: skip that check.
NOWARN=""
$VENV/bin/python -c "import importlib.metadata as m; m.version('vissl')" 2>/dev/null && NOWARN="--no-warn-conflicts"
$PIP install -q $NOWARN -r requirements-host.txt
# VISSL without its dependencies, then the Classy Vision release it was built for, over the
# copy bundled in the vissl wheel.  The PyPI package "apex" is unrelated: never.
$VENV/bin/python -c "import importlib.metadata as m; assert m.version('vissl') == '0.1.6'" 2>/dev/null \
  || $PIP install -q --no-deps vissl==0.1.6
$VENV/bin/python -c "import importlib.metadata as m; assert m.version('classy-vision') == '0.7.0'" 2>/dev/null \
  || $PIP install -q --no-deps --force-reinstall classy-vision==0.7.0
# Every requirement of every installed package is met, except VISSL's own pins (above).
if $PIP check > "$VENV/.pip-check.txt" 2>&1 || ! grep -qv '^vissl 0\.1\.6 ' "$VENV/.pip-check.txt"; then
  :
else
  echo "ERROR: broken requirements (besides VISSL 0.1.6's own pins):" >&2
  grep -v '^vissl 0\.1\.6 ' "$VENV/.pip-check.txt" >&2
  exit 1
fi
# Real data for the demo and the real-image tests: Fashion-MNIST from Debian's archive.
if [ ! -e /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] && command -v apt-get >/dev/null; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo -n"
  ($SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq dataset-fashion-mnist) \
    || echo "warning: could not install dataset-fashion-mnist (real-data tests will be skipped, make demo will fail)" >&2
fi
# The plugin itself, editable (the repository's code and configs are used directly), plus
# the start-up .pth that registers it in every process importing vissl (a wheel install,
# `pip install .`, ships the same .pth and a copy of configs/ by itself).
$PIP install -q --no-deps --no-build-isolation -e .
SITE=$($VENV/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
cp vissl_swav_plugin.pth "$SITE/vissl_swav_plugin.pth"
$VENV/bin/python -c "import vissl_swav_plugin._autoload as a, sys; import vissl; import vissl_swav_plugin as p; assert p.is_registered(), 'plugin did not register'; print('vissl-swav-plugin environment ready:', sys.version.split()[0])"
