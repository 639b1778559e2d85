"""llama-server's slot files: a file's KV kept on the server's disk while another file uses its slot.

With more files than slots, the slot map (``pool.SlotMap``) gives a file's slot to another. Before
the other file's prompt goes out, the slot is saved (``POST /slots/{id}?action=save``, on a server
started with ``--slot-save-path``); when the file comes back to a slot that does not hold it, its
slot file is restored there (``?action=restore``) and the slot map expects the reuse it brings. The
server's own RAM prompt cache (``--cache-ram``) may still hold the file, but nothing tells a client
so: a restore costs a file read, a miss a whole prefill.

A server without ``--slot-save-path`` answers HTTP 501: that replica's slot files are off, and a
file that comes back is computed again, reported as the miss ``remote_switched`` (not a silent
slowdown). A save or restore that fails otherwise is reported the same way
(``remote_switched``, ``remote_restore_failed``) and never fails the request.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from .drivers import restored
from .wire import Replica, ReplicaError

log = logging.getLogger("efim.backend")

KEPT_MAX = 1024  # files whose last prompt is remembered after they lost their slot
TIMEOUT = 60.0  # seconds a save or restore may take (the server waits for the slot to be idle)


@dataclass
class Kept:
    """A file that lost its slot: the prompt the slot held, and whether its KV is in a slot file."""

    tokens: np.ndarray
    done: threading.Event = field(default_factory=threading.Event)  # the save ended (or none was tried)
    saved: bool = False


def filename(key: str) -> str:
    """The slot file of a session key (a name llama-server accepts: no path, no user text)."""
    return "efim-" + hashlib.blake2b(key.encode(), digest_size=12).hexdigest() + ".bin"


class SlotFiles:
    """The slot files of one llama-server replica (``evicted``/``back`` under the pool's lock;
    ``save``/``restore`` on the call's thread, outside it)."""

    def __init__(self):
        self.enabled = True  # False once the server says it has no --slot-save-path
        self.kept: OrderedDict[str, Kept] = OrderedDict()
        self.saved = self.restored = self.failed = 0

    def evicted(self, key: str, tokens: np.ndarray) -> Kept | None:
        """``key``'s slot goes to another file: remember its prompt; the Kept to save, if any."""
        k = self.kept[key] = Kept(tokens)
        self.kept.move_to_end(key)
        while len(self.kept) > KEPT_MAX:
            self.kept.popitem(last=False)[1].done.set()
        if not self.enabled:
            k.done.set()
            return None
        return k

    def back(self, key: str) -> Kept | None:
        """``key`` comes back to a slot that does not hold it: what it had, if it had a slot here."""
        return self.kept.pop(key, None)

    def save(self, replica: Replica, slot: int, key: str, k: Kept) -> None:
        """Save ``slot`` (still holding ``key``'s KV) to ``key``'s slot file."""
        try:
            replica.post_json(f"/slots/{slot}?action=save", {"filename": filename(key)}, TIMEOUT)
            k.saved = True
            self.saved += 1
        except ReplicaError as e:
            self._failed("save", e)
        finally:
            k.done.set()

    def restore(self, replica: Replica, slot: int, key: str, k: Kept) -> int | None:
        """Load ``key``'s slot file into ``slot``; the tokens it restored, or None."""
        k.done.wait(TIMEOUT)  # a save of the same file may still be under way
        if not k.saved:
            return None
        try:
            n = restored(replica.post_json(f"/slots/{slot}?action=restore", {"filename": filename(key)}, TIMEOUT))
        except ReplicaError as e:
            self._failed("restore", e)
            return None
        self.restored += 1
        return n

    def _failed(self, what: str, e: ReplicaError) -> None:
        if e.reason == "http_501":  # "start it with --slot-save-path"
            self.enabled = False
            log.info("%s: no slot files (the server has no --slot-save-path)", e)
            return
        self.failed += 1
        log.warning("slot %s failed: %s", what, e)

    def status(self) -> dict:
        return {"enabled": self.enabled, "saved": self.saved, "restored": self.restored, "failed": self.failed}
