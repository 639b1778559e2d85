#!/usr/bin/env bash
# pip install, quietly, with a line every 30 s while it works (the Makefile's installs).
#   scripts/pip_install.sh PYTHON PIP-INSTALL-ARGS...
# A first llama-cpp-python install compiles llama.cpp (~10 min on 2 cores; pip's wheel cache makes
# the next ones seconds): pip -q says nothing all that time, so the elapsed time and what pip is
# building (from its -v log) show it is alive.
set -u
tick=${EFIM_PIP_TICK:-30}  # seconds between progress lines
py=$1
shift
log=$(mktemp "${TMPDIR:-/tmp}/efim-pip.XXXXXX")
trap 'rm -f "$log"' EXIT
"$py" -m pip install -v --disable-pip-version-check "$@" >"$log" 2>&1 &
pid=$!
start=$SECONDS
while kill -0 "$pid" 2>/dev/null; do
  for _ in $(seq "$tick"); do kill -0 "$pid" 2>/dev/null && sleep 1; done
  kill -0 "$pid" 2>/dev/null || break
  what=$(grep -aoE "Building wheel for [A-Za-z0-9_.-]+|\[ *[0-9]+%\] [A-Za-z]+ [^ ]+" "$log" | tail -n 1)
  echo "  pip install $*: $((SECONDS - start)) s${what:+, $what}" >&2
done
wait "$pid"
rc=$?
if [ "$rc" -ne 0 ]; then
  grep -avE "^ +(Link|Skipping|Found link|Ignoring)" "$log" | tail -n 40 >&2
  echo "pip install $* failed (exit $rc)" >&2
fi
exit "$rc"
