"""Attacks on the in-process store (issue 27, items 10 and 11): they run ``efim complete --no-daemon``
with the daemon's model (asked from its status), beside the daemon attacks.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from typing import Callable

from .base import Skipped, Target, check, status

OTHER_UID = 65534  # nobody: the "other user" when we are root


def _complete(t: Target, state_home, umask: int = 0o022) -> subprocess.CompletedProcess:
    model = status(t).get("model")
    if not model or not os.path.isfile(model):
        raise Skipped("the daemon's status names no model file")
    src = t.tmp / "store-probe.py"
    src.write_text("def fib(n):\n    return n\n")
    return subprocess.run([sys.executable, "-m", "efim_local.cli", "complete", "--no-daemon", "--model", model,
                           str(src), "-l", "2", "-c", "5", "--max-tokens", "2"], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "XDG_STATE_HOME": str(state_home)},
                          preexec_fn=lambda: os.umask(umask))


def planted_store(t: Target) -> str:
    """Another user's ``$XDG_STATE_HOME/efim`` (0777) with ``kv`` a link to one of our directories:
    the in-process store refuses it (one warning), the completion still runs, the target is untouched."""
    victim = t.tmp / "store-victim"
    victim.mkdir(exist_ok=True)
    os.chmod(victim, 0o755)
    (victim / "precious").write_text("mine\n")
    efim = t.tmp / "store-state" / "efim"
    efim.mkdir(parents=True, exist_ok=True)
    os.chmod(efim, 0o777)
    if os.getuid() == 0:
        os.chown(efim, OTHER_UID, OTHER_UID)
    if not (efim / "kv").is_symlink():
        (efim / "kv").symlink_to(victim)
    r = _complete(t, efim.parent)
    check(r.returncode == 0 and "Traceback" not in r.stderr, f"exit {r.returncode}: {r.stderr.strip()[-300:]}")
    check(stat.S_IMODE(victim.stat().st_mode) == 0o755, "the link's target was chmodded")
    check(sorted(p.name for p in victim.iterdir()) == ["precious"], "files were written into the link's target")
    check(r.stderr.count("serving without saved states") == 1, f"not one warning: {r.stderr.strip()}")
    return "planted kv link refused with one warning; completion answered, target untouched"


def index_mode(t: Target) -> str:
    """Under umask 022 the store's ``index.db`` (and its -wal/-shm while open) are 0600."""
    home = t.tmp / "store-fresh"
    r = _complete(t, home)
    check(r.returncode == 0, f"exit {r.returncode}: {r.stderr.strip()[-300:]}")
    files = [p for p in (home / "efim" / "kv").glob("index.db*")]
    check(bool(files), "no index.db was written")
    modes = {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in files}
    check(all(m == "0o600" for m in modes.values()), f"index files not private: {modes}")
    return f"{', '.join(sorted(modes))} 0600"


ATTACKS: dict[str, Callable[[Target], str]] = {f.__name__: f for f in (planted_store, index_mode)}
