"""`make install` in a temporary HOME: `efim` on PATH in a clean shell, and the systemd unit
pointing at it. pip reuses the real wheel cache (llama-cpp-python is built once), so this takes
about 20 s. And the Makefile's pip wrapper (scripts/pip_install.sh), which ticks once a second at
the fastest: its tests wait that long (they were unit tests, issue 38)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.helpers import ROOT


def pip_cache() -> str:
    """The user's pip cache (the test session moved XDG_CACHE_HOME, which pip follows)."""
    env = {k: v for k, v in os.environ.items() if k != "XDG_CACHE_HOME"}
    r = subprocess.run([sys.executable, "-m", "pip", "cache", "dir"], capture_output=True, text=True, env=env)
    return r.stdout.strip()


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_install_then_efim_in_a_clean_shell(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "VIRTUAL_ENV", "EFIM_"))}
    env.update(HOME=str(home), PIP_CACHE_DIR=pip_cache() or str(home / "pip-cache"))
    r = subprocess.run(["make", "-s", "install"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    link = home / ".local" / "bin" / "efim"
    assert link.is_symlink() and os.readlink(link) == str(home / ".local" / "share" / "efim" / "venv" / "bin" / "efim")
    assert f'export PATH="{home}/.local/bin:$PATH"' in r.stdout  # it says how to get it on PATH

    clean = {"PATH": f"{home}/.local/bin:/usr/bin:/bin", "HOME": str(home)}
    v = subprocess.run(["sh", "-c", "efim --version"], env=clean, capture_output=True, text=True, timeout=60)
    assert v.returncode == 0 and v.stdout == "efim, version 0.1.0\n", v.stderr
    # the installed copy serves a completion with its bundled model, from anywhere
    out = subprocess.run(["sh", "-c", f"cd / && efim complete {ROOT}/examples/fib.py -l 5 -c 9 --max-tokens 2 --json"],
                         env=clean, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["via"] == "in-process" and res["tokens"]["generated"] == 2 and res["layout"] == "efim"

    unit = (home / ".config" / "systemd" / "user" / "efim.service").read_text()
    assert f"ExecStart={link} serve\n" in unit
    assert not (ROOT / "build").exists()  # no build leftovers in the checkout


def test_progress_script_passes_pip_failures_on(tmp_path):
    """scripts/pip_install.sh: pip's exit code and the tail of its log when it fails."""
    r = subprocess.run(["bash", str(ROOT / "scripts" / "pip_install.sh"), "python3", "--no-index",
                        "no-such-package-efim"], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "failed (exit" in r.stderr


def test_progress_script_says_what_pip_builds(tmp_path):
    """A long pip run gets a line per tick with the elapsed time and what pip's -v log says it builds."""
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'Building wheel for llama-cpp-python (pyproject.toml): started'\n"
                    "sleep 2.5\necho '[ 42%] Building CXX object ggml.cpp.o'\nsleep 1.5\n")
    fake.chmod(0o755)
    r = subprocess.run(["bash", str(ROOT / "scripts" / "pip_install.sh"), str(fake), "-e", "."], capture_output=True,
                       text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "EFIM_PIP_TICK": "1"})
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) >= 2 and all(ln.startswith("  pip install -e .: ") for ln in lines), lines
    assert "Building wheel for llama-cpp-python" in lines[0] and "[ 42%] Building CXX" in lines[-1], lines
