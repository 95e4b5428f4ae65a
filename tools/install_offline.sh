#!/usr/bin/env bash
# Install the project on an offline machine from the bundle of tools/make_offline_bundle.sh.
# The machine brings torch, torchvision, numpy, scikit-learn, Pillow (and pytest); nothing is
# downloaded.  usage: tools/install_offline.sh [BUNDLE] [VENV]
#   VENV (default .gpu-venv, git-ignored): a venv that sees the system's packages
#   (--system-site-packages: its CUDA torch); VENV=none installs into $PY itself.
set -euo pipefail
cd "$(dirname "$0")/.."
BUNDLE=${1:-offline_bundle}
VENV=${2:-.gpu-venv}
PY=${PY:-python3}
ls "$BUNDLE"/vissl-0.1.6-*.whl >/dev/null 2>&1 \
  || { echo "install_offline: no vissl wheel in $BUNDLE/ (run tools/make_offline_bundle.sh)" >&2; exit 2; }
if [ "$VENV" != none ] && "$PY" -c 'import sys; sys.exit(sys.prefix == sys.base_prefix)'; then
  # $PY is itself a virtual environment: a venv made from it would not see its packages
  echo "install_offline: $PY is a virtual environment: installing into it (not into $VENV)" >&2
  # $VENV/bin/python (what `make gpu-check` runs) becomes a wrapper of that interpreter
  mkdir -p "$VENV/bin"
  printf '#!/bin/sh\nexec "%s" "$@"\n' "$("$PY" -c 'import sys; print(sys.executable)')" > "$VENV/bin/python"
  chmod +x "$VENV/bin/python"
  VENV=none
fi
if [ "$VENV" != none ]; then
  [ -x "$VENV/bin/python" ] || "$PY" -m venv --system-site-packages "$VENV"
  PY=$VENV/bin/python
  "$PY" -c "import torch" 2>/dev/null \
    || { echo "install_offline: $VENV does not see a torch (is torch installed for $PY?)" >&2; exit 2; }
fi
PIP="$PY -m pip --disable-pip-version-check"
# everything but Classy Vision, then Classy Vision 0.7.0 over the copy inside the vissl wheel
$PIP install -q --no-deps --no-index $(ls "$BUNDLE"/*.whl | grep -v '/classy_vision-')
$PIP install -q --no-deps --no-index --force-reinstall "$BUNDLE"/classy_vision-*.whl
# the plugin, editable, and its start-up .pth (registers it in every process importing vissl).
# --use-pep517: where `wheel` is installed (the GPU machine's image) pip otherwise takes the
# legacy `setup.py develop` path, whose setuptools 80 re-runs pip with build isolation: a
# download, which fails offline
$PIP install -q --no-deps --no-index --no-build-isolation --use-pep517 -e .
SITE=$($PY -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
cp vissl_swav_plugin.pth "$SITE/vissl_swav_plugin.pth"
$PY -c "import vissl, sys, torch; import vissl_swav_plugin as p; assert p.is_registered(), 'plugin did not register'; print('vissl-swav-plugin ready offline: Python', sys.version.split()[0], 'torch', torch.__version__, 'CUDA', torch.cuda.is_available())"
