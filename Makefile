# The two commands of this project:  `make demo` (main job) and `make test` (everything; CI).
# `make test-fast`: the unit tests only (tests/unit: no process started, a few minutes).
# Both create or reuse .venv and install everything on a bare machine.
PY      ?= python3.11
VENV    ?= .venv
VPY     := $(VENV)/bin/python
STAMP   := $(VENV)/.deps-$(shell cat requirements-host.txt setup.py vissl_swav_plugin.pth | sha1sum | cut -c1-12)
PYTEST_ARGS ?=
TEST_WORKERS ?= 2

BUNDLE  ?= offline_bundle
GPU_VENV ?= .gpu-venv
GPU_OUT ?= gpu_check
GPU_CHECK_ARGS ?=

.PHONY: venv test test-fast lint demo bench bundle gpu-venv gpu-check clean-venv

venv: $(STAMP)

$(STAMP): requirements-host.txt setup.py vissl_swav_plugin.pth
	bash tools/install_env.sh "$(PY)" "$(VENV)"
	rm -f $(VENV)/.deps-*
	touch $@

# the linters first, then the suite in $(TEST_WORKERS) worker processes (pytest-xdist's own
# scheduling, --dist worksteal: each worker starts on its share of the tests in collection order
# and a worker that runs dry takes half of another's pending tests).  --max-worker-restart=0: a
# worker that dies (a crash in native code) ends the run at once, naming the test it died in;
# with restarts, pytest-xdist 3.8 can wait forever for the dead worker's tests.  -c pytest.ini:
# the time limits of pytest.ini hold whatever TEST_PATHS names.
TEST_PATHS ?= tests
test: lint
	$(VPY) -m pytest -c pytest.ini -n $(TEST_WORKERS) --dist worksteal --max-worker-restart=0 $(TEST_PATHS) $(PYTEST_ARGS)

test-fast: venv
	$(VPY) -m pytest tests/unit $(PYTEST_ARGS)

# ruff (rules in ruff.toml) and the architecture contracts (also checked by
# tests/unit/package/test_layers.py); `make test` runs it first
lint: venv
	$(VENV)/bin/ruff check --no-cache .
	$(VENV)/bin/lint-imports --config .importlinter --no-cache

demo: venv
	$(VPY) tools/demo.py

bench: venv
	for b in benchmarks/bench_*.py; do $(VPY) $$b || exit 1; done

# Offline GPU machine (docs/gpu.md): `make bundle` here (network), then there, offline,
# `make gpu-check` installs the bundle into $(GPU_VENV) (sees the system's CUDA torch) and
# writes $(GPU_OUT)/gpu_check.json and gpu_check.md.  The CPU dry run is part of `make test`.
bundle:
	bash tools/make_offline_bundle.sh "$(BUNDLE)"

gpu-venv:
	bash tools/install_offline.sh "$(BUNDLE)" "$(GPU_VENV)"

gpu-check: gpu-venv
	$(GPU_VENV)/bin/python benchmarks/gpu_check.py --out "$(GPU_OUT)" --fashion-mnist "$(BUNDLE)/fashion-mnist" $(GPU_CHECK_ARGS)

clean-venv:
	rm -rf $(VENV)
