# efim-local. `make run` sets up everything and runs a real completion; `make test` runs the tests
# (`make test-fast`: the unit tier only).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export CMAKE_BUILD_PARALLEL_LEVEL ?= 2

.PHONY: setup run test test-fast bench bench-quick cuda server clean nvim model

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

# All three tiers (tests/unit, tests/engine, tests/e2e); see tests/conftest.py.
test: setup nvim
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q

# The unit tier alone: no model, no llama.cpp decode, no daemon; a few seconds.
test-fast: setup
	$(PY) -m pytest -q tests/unit

# Reproduce the bundled default model from scratch (about 30 min on 2 cores).
model: setup
	$(PY) -m pip install -q -e '.[train]'
	$(PY) scripts/train.py --out out/train --gguf efim_local/data/efim-default.gguf

# llama-server (CPU) from the pinned llama.cpp source: the peer `efim bench` compares against.
server:
	PY=$(PY) bash native/build_server.sh

# The same llama.cpp with CUDA for CUDA_ARCHS (cuBLAS from PyPI); see native/README.md.
CUDA_ARCHS ?= 86-real
cuda:
	PY=$(PY) CUDA_ARCHS="$(CUDA_ARCHS)" bash native/build_cuda.sh

bench-quick: setup server
	$(PY) -m pip install -q -e '.[bench]'
	$(VENV)/bin/efim bench --quick

bench: setup server
	$(PY) -m pip install -q -e '.[bench]'
	$(VENV)/bin/efim bench

clean:
	rm -rf $(VENV) build *.egg-info
