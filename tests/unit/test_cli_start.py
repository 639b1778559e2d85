"""Fast CLI start: commands that load no model import neither llama.cpp nor numpy (nor the other
heavy modules); a cached completion through the daemon imports only what it needs.

Each check runs in a fresh interpreter (this one has imported who knows what). Timings are not
asserted here: `efim bench cli` measures them."""

import json
import subprocess
import sys

HEAVY = ("llama_cpp", "numpy", "sqlite_utils", "gguf", "huggingface_hub", "watchdog", "torch", "tokenizers",
         "pygls")

CHILD = """
import json, sys
from efim_local.cli import main
for args in {commands!r}:
    try:
        main.main(args, standalone_mode=False)
    except SystemExit:
        pass
# what `efim complete` needs before it reaches the daemon
import efim_local.daemon.client, efim_local.prompt.document, efim_local.request
efim_local.prompt.document.offset_of("x = 1\\n" * 200, 150, 2)
print(json.dumps(sorted(m for m in {heavy!r} if m in sys.modules)), file=sys.stderr)
"""


def test_commands_without_a_model_import_no_heavy_module(tmp_path):
    commands = [["--version"], ["--help"], ["complete", "--help"], ["models", "list", "--json"],
                ["daemon", "status"], ["daemon", "logs", "-n", "1"], ["cache", "--help"]]
    env = {"XDG_RUNTIME_DIR": str(tmp_path / "rt"), "XDG_STATE_HOME": str(tmp_path / "st"),
           "XDG_DATA_HOME": str(tmp_path / "data"), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    r = subprocess.run([sys.executable, "-c", CHILD.format(commands=commands, heavy=HEAVY)], capture_output=True,
                       text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stderr.strip().splitlines()[-1]) == []


def test_version_is_the_installed_one():
    """`efim --version` reads efim_local.__version__ (no importlib.metadata at start-up): it must
    match the package metadata (pyproject.toml)."""
    import importlib.metadata

    import efim_local

    assert efim_local.__version__ == importlib.metadata.version("efim-local")
