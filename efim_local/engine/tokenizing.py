"""The interruptible tokenizer: idle work tokenizes a large document without making a request wait.

llama_tokenize is one C call: on a large document it can take seconds (a
SentencePiece vocabulary is superlinear: 1 MiB took 12 s with gemma-3's), and idle work that
tokenizes could not yield to a request meanwhile. Here the call runs on a helper thread (at the
lowest CPU priority, so it never slows a request's decode) while the engine thread polls
``should_stop``: when a request comes, the engine thread raises Cancelled at once and the call goes
on in the background. Its result is kept: the idle task, run again later, finds its tokens there
instead of starting over, so an interrupted prefill still makes progress. At most one such call runs
at a time. Tokenizing reads only the vocabulary, which llama.cpp allows concurrently with decoding
(llama-server does the same). Whoever frees the model first calls ``drain()``.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from concurrent.futures import Future
from contextlib import contextmanager

from ..errors import Cancelled

SMALL = 16 << 10  # characters tokenized inline: milliseconds, not worth a thread
POLL = 0.005  # seconds between should_stop() polls
KEEP = 2  # results kept (a plan tokenizes a prefix and a suffix)

_lock = threading.Lock()
_running: threading.Thread | None = None  # the last helper thread (it may outlive its caller)
_done: deque = deque(maxlen=KEEP)  # (tokenize, text, args, kw, tokens) of finished calls


def interruptible(tokenize, should_stop):
    """``tokenize`` with the same arguments and result, run as described above."""

    def run(text, *args, **kw):
        global _running
        if len(text) <= SMALL or should_stop is None:
            return tokenize(text, *args, **kw)
        while True:
            with _lock:
                hit = next((d[4] for d in _done if d[0] == tokenize and d[2:4] == (args, kw) and d[1] == text), None)
                busy = _running is not None and _running.is_alive()
            if hit is not None:
                return list(hit)
            if not busy:
                break
            _running.join(POLL)  # an earlier call still runs: maybe it is this very text
            if should_stop():
                raise Cancelled()
        fut: Future = Future()

        def work():
            try:
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
            except (OSError, AttributeError):
                pass
            try:
                tokens = tokenize(text, *args, **kw)
            except BaseException as e:  # noqa: BLE001 - handed to the waiting engine thread
                fut.set_exception(e)
                return
            with _lock:
                _done.append((tokenize, text, args, kw, tokens))
            fut.set_result(tokens)

        _running = threading.Thread(target=work, name="efim-tokenize", daemon=True)
        _running.start()
        while True:
            try:
                return list(fut.result(POLL))
            except TimeoutError:
                if should_stop():
                    raise Cancelled() from None

    return run


def drain(timeout: float | None = None) -> None:
    """Wait for a call still running in the background. Call it before the model is freed: the
    call reads the model's vocabulary."""
    t = _running
    if t is not None:
        t.join(timeout)


class Tokenizer:
    """The planner's tokenize (``make_planner``; every copy of the planner shares it): the model's, run
    as :func:`interruptible` describes within :meth:`stopping` (idle work, on the engine thread), as it
    is otherwise. It changes its own state only: nothing swaps the planner's function."""

    def __init__(self, tokenize):
        self.plain = self.run = tokenize

    def __call__(self, text, *args, **kw):
        return self.run(text, *args, **kw)

    @contextmanager
    def stopping(self, should_stop):
        """Within the block, tokenizing polls ``should_stop`` (Cancelled when it says stop)."""
        before, self.run = self.run, interruptible(self.plain, should_stop)
        try:
            yield
        finally:
            self.run = before
