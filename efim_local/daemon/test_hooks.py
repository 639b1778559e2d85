"""Hooks for tests of the daemon's failure handling, off unless ``EFIM_TEST_HOOKS=1``.

With it set, the daemon answers ``_test/killEngine`` (ends the engine thread as a bug would, so
the watchdog can be tested) and takes its deadlines from ``EFIM_TEST_<NAME>_TIMEOUT`` (so a test
of a slow client waits one second, not ten). Without it, none of this exists.
"""

from __future__ import annotations

import os


def enabled() -> bool:
    return os.environ.get("EFIM_TEST_HOOKS") == "1"


def seconds(name: str, default: float) -> float:
    """A deadline: ``default``, or ``EFIM_TEST_<NAME>_TIMEOUT`` when hooks are on."""
    v = os.environ.get(f"EFIM_TEST_{name}_TIMEOUT") if enabled() else None
    return float(v) if v else default


def methods(handlers) -> dict:
    """The test-only methods (none unless hooks are on)."""
    if not enabled():
        return {}

    def kill_engine(conn, msg):
        def die(engine):
            raise SystemExit("killed by _test/killEngine")
        handlers.worker.post(die)
        return {"killing": True}

    return {"_test/killEngine": kill_engine}
