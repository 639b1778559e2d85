"""Attacks on a running daemon and on ``efim lsp``: each bad-client behaviour of issues 17 and 27,
and whether efim held.

Every attack talks to a real daemon over its real socket (or to a real ``efim lsp`` over its
stdio) and ends by checking that the daemon still answers a completion. Used by
``python -m tests.attack`` (``__main__.py``, from the checkout's root: against any running daemon, e.g. one from ``efim daemon start``) and by
tests/e2e/test_daemon_attack.py (a test daemon with short deadlines). An attack returns a one-line
detail when efim held and raises ``Failed`` when it did not; ``Skipped`` when it cannot run here
(e.g. the test hooks are off). ``OWN_DAEMON``: the attacks that start daemons of their own.

Modules: ``base`` (target, raw connection, checks), ``daemon`` (issue 17's socket attacks),
``lsp`` (issue 27: refused edits, LSP framing, a daemon that cannot start), ``files`` (watched
roots, the socket's lock file).
"""

from __future__ import annotations

import time
from typing import Callable

from . import cli, daemon, files, lsp, store
from .base import Failed, Raw, Skipped, Target, check, error_code, small_complete, status

__all__ = ["ATTACKS", "OWN_DAEMON", "Failed", "Raw", "Skipped", "Target", "check", "error_code", "run",
           "small_complete", "status"]

ATTACKS: dict[str, Callable[[Target], str]] = {**daemon.ATTACKS, **lsp.ATTACKS, **files.ATTACKS,
                                                  **store.ATTACKS, **cli.ATTACKS}
OWN_DAEMON = ("socket_path", "state_dir", *files.OWN_DAEMON, *lsp.OWN_DAEMON)


def run(t: Target, names: list[str] | None = None) -> list[dict]:
    """Run the attacks (all, or ``names``); one row each: name, held (True/False/None: skipped), detail."""
    rows = []
    for name in names or ATTACKS:
        t0 = time.monotonic()
        try:
            held, detail = True, ATTACKS[name](t)
        except Skipped as e:
            held, detail = None, str(e)
        except Exception as e:  # noqa: BLE001 - a failed attack is a row, not a crash of the runner
            held, detail = False, f"{e.__class__.__name__}: {e}"
        rows.append({"attack": name, "held": held, "detail": detail, "seconds": round(time.monotonic() - t0, 1)})
    return rows
