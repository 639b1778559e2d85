"""Attacks on the command line's inputs rather than the daemon (issue 27, item 11): a catalog file
(``EFIM_KNOWN_MODELS``) that is a FIFO or ``/dev/zero``, and catalog entries whose file or
repository climbs out of the models directory with ``..``. Each must be one line and exit 2, at
once. ``python -m tests.attack`` runs them with the daemon attacks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable

from .base import Target, check


def _models_list(t: Target, catalog: str, timeout: float = 20.0) -> subprocess.CompletedProcess:
    env = {**os.environ, "EFIM_KNOWN_MODELS": catalog, "XDG_DATA_HOME": str(t.tmp / "data")}
    try:
        return subprocess.run([sys.executable, "-m", "efim_local.cli", "models", "list"], capture_output=True,
                              text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        check(False, f"`efim models list` with EFIM_KNOWN_MODELS={catalog} hung for {timeout:.0f} s")
        raise


def known_models_special(t: Target) -> str:
    fifo = t.tmp / "known-fifo"
    if not fifo.exists():
        os.mkfifo(fifo)
    for path in (str(fifo), "/dev/zero"):
        r = _models_list(t, path)
        check(r.returncode == 2 and r.stderr.count("\n") == 1 and "not a regular file" in r.stderr,
              f"EFIM_KNOWN_MODELS={path}: exit {r.returncode}: {r.stderr[-200:]!r}")
    return "a FIFO and /dev/zero as EFIM_KNOWN_MODELS: one line, exit 2, at once"


def catalog_escape(t: Target) -> str:
    base = {"name": "esc", "repo": "owner/name", "file": "m.gguf", "family": "qwen", "params": "1B",
            "size_mb": 1, "ram_mb": 1}
    for bad in ({"file": "../../../../tmp/x.gguf"}, {"file": "a/../../x.gguf"}, {"repo": "../.."}):
        p = t.tmp / "known-escape.json"
        p.write_text(json.dumps([{**base, **bad}]))
        r = _models_list(t, str(p))
        check(r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr,
              f"catalog entry {bad}: exit {r.returncode}: {r.stderr[-200:]!r}")
    return "catalog entries with '..' in file or repo: one line, exit 2"


ATTACKS: dict[str, Callable[[Target], str]] = {f.__name__: f for f in (known_models_special, catalog_escape)}
