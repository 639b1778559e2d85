# efim-local. `make run` sets up everything and runs a real completion; `make test` runs the tests.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export CMAKE_BUILD_PARALLEL_LEVEL ?= 2

.PHONY: setup run test bench clean nvim model

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -e '.[test]'
	touch $@

# The editor-plugin tests drive a real headless Neovim.
nvim:
	@command -v nvim >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq neovim >/dev/null; } || \
	  echo "warning: neovim not installed; its tests will be skipped"

run: setup
	$(VENV)/bin/efim complete examples/fib.py --line 5 --column 9 --max-tokens 24

test: setup nvim
	$(PY) -m pytest -q

# Reproduce the bundled default model from scratch (about 30 min on 2 cores).
model: setup
	$(PY) -m pip install -q -e '.[train]'
	$(PY) scripts/train.py --out out/train --gguf efim_local/data/efim-default.gguf

bench: setup
	$(PY) -m pip install -q -e '.[bench]'
	$(PY) scripts/bench_rounds.py

clean:
	rm -rf $(VENV) build *.egg-info
