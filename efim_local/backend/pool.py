"""Replicas, which one serves a file, and remote calls that never block the engine thread.

- One file's requests go to one replica (consistent hashing of its session key on a ring of
  virtual nodes), so its prompt stays in one server's cache; other files spread. A replica that
  fails is skipped for a while (doubling back-off) and the next one on the ring serves.
- On a llama-server replica, a local slot map pins each file to one slot (``id_slot``) and
  remembers the prompt the slot holds: the reuse to expect, checked against the server's count.
- Each :class:`Call` streams on its own thread into a queue; the engine thread takes what came
  (``take``) and, when nothing came for any call, waits briefly on the pool (``wait_any``). A call
  that fails over after some text went out resends the prompt to the next replica and skips the
  text already delivered.
- Every event is parsed and checked (``drivers.Reader``) before it is queued: a reply that breaks
  the protocol fails its replica like a dead one. A call has one deadline for all of it (every
  replica it tries, every event, pings too): once it has passed, ``take`` ends the call with its error.
"""

from __future__ import annotations

import bisect
import hashlib
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from ..errors import BackendError, one_line
from ..kv.prefix import common_prefix
from .drivers import DRIVERS, Bounds, Chunk, OpenAI, Reader, Sampling
from .slotfiles import SlotFiles
from .wire import READ_TIMEOUT, EventStream, Replica, ReplicaError

log = logging.getLogger("efim.backend")

DEADLINE = 120.0  # seconds a remote request may take in all (a long prompt's prefill, then its answer)
VNODES = 64  # ring points per replica: files spread evenly, and a lost replica moves only its own
DOWN_MIN, DOWN_MAX = 2.0, 30.0  # seconds a failed replica is skipped, doubling while it keeps failing


def _hash(s: str) -> int:
    return int.from_bytes(hashlib.blake2b(s.encode(), digest_size=8).digest(), "big")


class Ring:
    """Consistent hashing: the order in which replicas serve a key (its own first)."""

    def __init__(self, names: list[str]):
        self.n = len(names)
        pts = sorted((_hash(f"{name}#{i}"), r) for r, name in enumerate(names) for i in range(VNODES))
        self.keys, self.owners = [p[0] for p in pts], [p[1] for p in pts]

    def order(self, key: str) -> list[int]:
        out: list[int] = []
        i = bisect.bisect(self.keys, _hash(key))
        for j in range(len(self.owners)):
            r = self.owners[(i + j) % len(self.owners)]
            if r not in out:
                out.append(r)
                if len(out) == self.n:
                    break
        return out


@dataclass
class SlotMap:
    """The slots of one llama-server replica: which file each serves, and the prompt it holds."""

    n: int
    owner: dict[int, str] = field(default_factory=dict)
    used: dict[int, float] = field(default_factory=dict)
    held: dict[int, np.ndarray] = field(default_factory=dict)

    def slot_for(self, key: str) -> int:
        """The file's own slot, else a free one, else the least recently used."""
        return self.pin(key)[0]

    def pin(self, key: str) -> tuple[int, tuple[str, np.ndarray] | None, bool]:
        """The file's slot; the file whose slot it was, with the prompt it held (None if it was
        free or the file's own); whether it is new to the file (it does not hold the file's KV)."""
        mine, gone = next((s for s, k in self.owner.items() if k == key), None), None
        if mine is None:
            free = [s for s in range(self.n) if s not in self.owner]
            mine = free[0] if free else min(self.owner, key=lambda s: self.used.get(s, 0.0))
            if mine in self.owner:
                gone = (self.owner[mine], self.held.get(mine, np.zeros(0, np.int32)))
            self.owner[mine], self.held[mine] = key, np.zeros(0, np.int32)
        self.used[mine] = time.monotonic()
        return mine, gone, not len(self.held[mine])

    def expected(self, slot: int, tokens: np.ndarray) -> int:
        """Prompt tokens the slot should serve from its cache (the last is always computed again)."""
        held = self.held.get(slot)
        return min(common_prefix(held, tokens), len(tokens) - 1) if held is not None and len(held) else 0


@dataclass
class Member:
    replica: Replica
    slots: SlotMap | None = None  # known after the first call (llama-server: GET /props)
    files: SlotFiles = field(default_factory=SlotFiles)
    down_until: float = 0.0
    backoff: float = DOWN_MIN
    served: int = 0
    failed: int = 0
    misses: int = 0


class Pool:
    """Several replicas of one model behind one driver (thread-safe)."""

    def __init__(self, urls: list[str], driver: str = "llama-server", api_key: str | None = None,
                 model: str = "default", read_timeout: float = READ_TIMEOUT, *, n_vocab: int,
                 timeout: float = DEADLINE):
        """``read_timeout``: seconds a stream may stay silent (a queued request's wait counts);
        ``timeout``: seconds a call may take in all; ``n_vocab``: the local vocabulary's size (a
        token id a server names must be below it)."""
        if not urls:
            raise BackendError("no backend URL given")
        self.n_vocab, self.timeout = n_vocab, timeout
        self.driver = DRIVERS[driver]() if driver != "openai" else OpenAI(model)
        self.members = [Member(Replica(u, api_key)) for u in urls]
        self.ring = Ring([m.replica.url for m in self.members])
        self.read_timeout = read_timeout
        self.cond = threading.Condition()
        self.unread = 0  # events queued in calls that nobody took yet

    def order(self, key: str) -> list[Member]:
        """The replicas that serve ``key``, in turn: its own first; those that failed lately last."""
        now = time.monotonic()
        members = [self.members[i] for i in self.ring.order(key)]
        return [m for m in members if m.down_until <= now] + [m for m in members if m.down_until > now]

    def start(self, tokens: list[int], sampling: Sampling, key: str) -> "Call":
        """Start streaming a completion of ``tokens`` for session ``key`` (returns at once)."""
        call = Call(self, [int(t) for t in tokens], sampling, key)
        threading.Thread(target=call.run, name="efim-remote", daemon=True).start()
        return call

    @property
    def heals(self) -> bool:
        """Whether the servers can heal a token (a grammar on the first token: llama-server)."""
        return not isinstance(self.driver, OpenAI)

    def peek(self, tokens) -> int:
        """The most of ``tokens`` some replica's slot is expected to serve from its cache."""
        prompt = np.asarray(tokens, np.int32)
        with self.cond:
            return max((m.slots.expected(s, prompt) for m in self.members if m.slots is not None
                        for s in m.slots.held), default=0)

    def wait_any(self, timeout: float) -> None:
        """Wait until some call has an event nobody took, at most ``timeout`` seconds."""
        with self.cond:
            if self.unread == 0:
                self.cond.wait(timeout)

    # -- bookkeeping (any thread) -----------------------------------------------------------
    def _pin(self, m: Member, key: str, tokens: list[int]) -> tuple[int | None, dict]:
        """The slot for ``key`` on ``m``, and what to expect of it: ``expected_cached``; for a file
        that had lost its slot here, ``restored`` (tokens its slot file brought back) or ``lost``
        (why not) and ``would_cache`` (what it would have reused). Saves the slot's previous file."""
        if m.slots is None:
            n = self.driver.slots(m.replica)
            with self.cond:
                m.slots = m.slots or SlotMap(n)
        if isinstance(self.driver, OpenAI):
            return None, {"expected_cached": 0}
        prompt = np.asarray(tokens, np.int32)
        with self.cond:
            slot, gone, fresh = m.slots.pin(key)
            save = m.files.evicted(*gone) if gone is not None and len(gone[1]) else None
            back = m.files.back(key) if fresh else None
        info: dict = {}
        if save is not None:  # before this file's prompt overwrites it
            m.files.save(m.replica, slot, gone[0], save)
        if back is not None:
            n = m.files.restore(m.replica, slot, key, back)
            with self.cond:
                if n and m.slots.owner.get(slot) == key:
                    m.slots.held[slot] = back.tokens
            info = {"restored": n} if n else {"lost": "remote_restore_failed" if back.saved else "remote_switched",
                                              "would_cache": min(common_prefix(back.tokens, prompt), len(prompt) - 1)}
        with self.cond:
            return slot, {"expected_cached": m.slots.expected(slot, prompt), **info}

    def _ok(self, m: Member, slot: int | None, key: str, tokens: list[int], miss: bool) -> None:
        with self.cond:
            m.down_until, m.backoff = 0.0, DOWN_MIN
            m.served += 1
            m.misses += miss
            if slot is not None and m.slots is not None and m.slots.owner.get(slot) == key:
                m.slots.held[slot] = np.asarray(tokens, np.int32)

    def _failed(self, m: Member) -> None:
        with self.cond:
            m.failed += 1
            m.down_until = time.monotonic() + m.backoff
            m.backoff = min(DOWN_MAX, m.backoff * 2)

    def status(self) -> dict:
        now = time.monotonic()
        with self.cond:
            return {"driver": self.driver.name, "replicas": [
                {"url": m.replica.url, "up": m.down_until <= now, "slots": m.slots.n if m.slots else None,
                 "served": m.served, "failed": m.failed, "cache_misses": m.misses,
                 "slot_files": None if isinstance(self.driver, OpenAI) else m.files.status()}
                for m in self.members]}


class Call:
    """One remote completion in flight. Its thread pushes events; the caller takes them:
    ``("replica", info)`` when a replica takes it, ``("failover", info)`` when one fails,
    ``("chunk", Chunk)``, then ``("end", info)`` or ``("error", BackendError)``, the last one by its
    deadline at the latest."""

    def __init__(self, pool: Pool, tokens: list[int], sampling: Sampling, key: str):
        self.pool, self.tokens, self.sampling, self.key = pool, tokens, sampling, key
        self.bounds = Bounds(pool.n_vocab, len(tokens), sampling.n_predict)
        self.deadline = time.monotonic() + pool.timeout
        self.events: deque = deque()
        self.finished = False  # the last event was pushed: nothing more is
        self.closed = False
        self.member: Member | None = None  # the replica it runs on now
        self.stream: EventStream | None = None
        self.delivered = ""  # text already pushed: a replica that takes over skips it
        self.errors: list[str] = []  # why each replica tried failed

    def take(self) -> list:
        """The events that came since the last take (the call's error once its deadline passed)."""
        with self.pool.cond:
            self._expire()
            out = list(self.events)
            self.events.clear()
            self.pool.unread -= len(out)
            return out

    def wait(self, timeout: float | None = None) -> None:
        """Wait until this call has an event to take (or has ended), at most ``timeout`` seconds (and
        never past its deadline)."""
        with self.pool.cond:
            left = max(0.0, self.deadline - time.monotonic())
            self.pool.cond.wait_for(lambda: self.events or self.finished or self.closed,
                                    left if timeout is None else min(timeout, left))
            self._expire()

    def close(self) -> None:
        """Cancel: close the connection (the server stops generating); events still queued are dropped."""
        with self.pool.cond:
            self.closed = True
            self.pool.unread -= len(self.events)
            self.events.clear()
            stream = self.stream
        if stream is not None:
            stream.close()

    def _expire(self) -> None:
        """Past the deadline (under the lock): the replica it runs on failed, the call ends with its error.
        (Its thread may be stuck in a read that a trickle of bytes keeps alive: only this bounds it.)"""
        if self.finished or self.closed or time.monotonic() < self.deadline:
            return
        m = self.member
        if m is not None:
            self.pool._failed(m)
            self.errors.append(f"{m.replica.url}: deadline")
        why = f" ({'; '.join(self.errors)})" if self.errors else ""
        self._push("error", BackendError(f"no answer from the backends within {self.pool.timeout:g} s{why}"))
        if self.stream is not None:
            self.stream.close()

    def _push(self, kind: str, data) -> bool:
        with self.pool.cond:
            if self.closed or self.finished:
                return False
            self.events.append((kind, data))
            self.pool.unread += 1
            self.finished = kind in ("end", "error")
            self.pool.cond.notify_all()
            return True

    def _over(self) -> bool:
        with self.pool.cond:
            return self.closed or self.finished

    def run(self) -> None:
        try:
            for m in self.pool.order(self.key):
                if self._over():
                    return
                try:
                    self._run_on(m)
                    return
                except ReplicaError as e:
                    if self._over():
                        return
                    if time.monotonic() >= self.deadline:  # a read the deadline cut short: its error
                        with self.pool.cond:
                            self._expire()
                        return
                    self.pool._failed(m)
                    self.errors.append(f"{m.replica.url}: {e.reason}" + (f" ({e.detail})" if e.detail else ""))
                    self._push("failover", {"url": m.replica.url, "reason": e.reason})
            self._push("error", BackendError("every backend failed (" + "; ".join(self.errors) + ")"))
        except Exception as e:  # noqa: BLE001 - a bug here must not leave the request without its reply
            log.exception("a remote call failed")
            self._push("error", BackendError(one_line(f"a remote call failed: {type(e).__name__}: {e}")[:300]))

    def _run_on(self, m: Member) -> None:
        """Stream the completion from one replica (ReplicaError if it fails)."""
        with self.pool.cond:
            self.member = m
        slot, pinned = self.pool._pin(m, self.key, self.tokens)
        path, body, headers = self.pool.driver.request(self.tokens, self.sampling, slot, self.key)
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise ReplicaError(f"{m.replica.url}: the deadline passed", "deadline")
        stream = m.replica.stream(path, body, headers, min(self.pool.read_timeout, left))
        try:
            with self.pool.cond:
                self.stream = stream
                if self.closed or self.finished:
                    return
            self._push("replica", {"url": m.replica.url, "slot": slot, **pinned})
            read = Reader(self.pool.driver, self.bounds)
            skip, last, stop = self.delivered, Chunk(final=True), None
            for msg in stream:
                c = read(msg)
                if skip and c.text:  # a replica that took over: the text the editor has is not sent again
                    n = len(_common(skip, c.text))
                    if n < min(len(skip), len(c.text)):  # it answers differently (sampling): stop here
                        c = Chunk(final=True, stop="failover")
                        break
                    skip, c.text = skip[n:], c.text[n:]
                self.delivered += c.text
                if not self._push("chunk", c):
                    return
                last, stop = c, c.stop or stop  # an OpenAI stream says why before its usage
                if c.final:
                    break
            if self._over():  # cancelled, or its deadline passed meanwhile (the stream was closed)
                return
            self.pool._ok(m, slot, self.key, self.tokens, miss_reason(pinned, last.cached, False) is not None)
            self._push("end", {"cached": last.cached, "evaluated": last.evaluated, "generated": last.generated,
                               "stop": stop, "prompt_ms": last.prompt_ms})
        finally:
            stream.close()


def miss_reason(pinned: dict, cached: int | None, ended: bool) -> str | None:
    """Why a replica reused less of its cache than expected: ``remote_evicted`` (the slot lost
    what the slot map knew it held: another client, a restart), the file's ``lost`` reason (its slot
    went to another file and could not be restored), ``remote_unknown`` (the server did not say)."""
    if cached is None:
        return "remote_unknown" if ended else None
    if cached < pinned.get("expected_cached", 0):
        return "remote_evicted"
    if pinned.get("lost") and cached < pinned.get("would_cache", 0):
        return pinned["lost"]
    return None


def _common(a: str, b: str) -> str:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return a[:n]
