# The two commands of this project:  `make demo` (main job) and `make test`.
# Both create or reuse .venv and install everything on a bare machine.
PY      ?= python3.11
VENV    ?= .venv
VPY     := $(VENV)/bin/python
STAMP   := $(VENV)/.deps-$(shell cat requirements-host.txt setup.py vissl_swav_plugin.pth | sha1sum | cut -c1-12)
PYTEST_ARGS ?=

.PHONY: venv test demo bench clean-venv

venv: $(STAMP)

$(STAMP): requirements-host.txt setup.py vissl_swav_plugin.pth
	bash tools/install_env.sh "$(PY)" "$(VENV)"
	rm -f $(VENV)/.deps-*
	touch $@

test: venv
	$(VPY) -m pytest tests $(PYTEST_ARGS)

demo: venv
	$(VPY) tools/demo.py

bench: venv
	for b in benchmarks/bench_*.py; do $(VPY) $$b || exit 1; done

clean-venv:
	rm -rf $(VENV)
