"""Instant answers over a real daemon socket (issue 24): an editor that types the suggestion through,
keystroke by keystroke (didChange, then complete), is answered with 0 evaluated prompt tokens; an
accept is answered from the continuation computed while the suggestion was shown; a repeated plan
from the cache; ``status`` counts the sources."""

import time

import pytest

from tests.helpers import SOURCES, Daemon, wait_until

DOC = SOURCES[4][:5000]
REPLACEMENT = "\ufffd"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, tiny_model):
    d = Daemon(tmp_path_factory.mktemp("daemon"), tiny_model).start()
    yield d
    d.stop()


class Editor:
    """One synced document, edited and completed as an editor does."""

    def __init__(self, c, path: str, text: str):
        self.c, self.path, self.text, self.version = c, path, text, 1
        c.call("didOpen", {"path": path, "text": text, "version": 1})

    def type(self, at: int, s: str) -> None:
        line = self.text.count("\n", 0, at)
        col = at - (self.text.rfind("\n", 0, at) + 1)
        self.version += 1
        pos = {"line": line, "character": col}
        self.c.call("didChange", {"path": self.path, "version": self.version,
                                  "contentChanges": [{"range": {"start": pos, "end": pos}, "text": s}]})
        self.text = self.text[:at] + s + self.text[at:]

    def complete(self, at: int, **kw) -> dict:
        return self.c.call("complete", {"path": self.path, "offset": at, "version": self.version, "max_tokens": 12,
                                        **kw})


def test_typing_the_suggestion_through_evaluates_nothing(daemon):
    with daemon.client() as c:
        ed = Editor(c, "through.py", DOC)
        cur = DOC.index("\n", 2500) + 5
        out = ed.complete(cur)
        typed = zero = 0
        for _ in range(60):
            follows = bool(out["text"]) and out["text"][0] != REPLACEMENT
            ch = out["text"][0] if follows else "x"  # off the suggestion: a new one is computed
            ed.type(cur, ch)
            cur += 1
            out = ed.complete(cur)
            if follows:
                typed += 1
                zero += out["tokens"]["evaluated"] == 0 and out["source"] in ("type-through", "accept")
        assert typed >= 20 and zero >= 0.9 * typed, (zero, typed)
        src = c.call("status")["requests"]["sources"]
        assert src["type-through"] >= zero - src["accept"] and src["answers"] >= 61


def test_accept_is_answered_from_what_was_computed_ahead(daemon):
    with daemon.client() as c:
        ed = Editor(c, "accept.py", DOC)
        cur = DOC.index("\n", 3000) + 5
        out = ed.complete(cur)
        accepts = ahead = 0
        for _ in range(5):
            text = out["text"]
            if not text or REPLACEMENT in text:
                ed.type(cur, "y")
                cur += 1
                out = ed.complete(cur)
                continue
            # The suggestion is shown; the daemon computes ahead meanwhile (queued just after the reply).
            # On a loaded machine a fixed pause was not enough: the answer's last token was not decoded
            # yet, and the accept paid for it.
            time.sleep(0.3)
            wait_until(lambda: not (st := c.call("status"))["idle_tasks"] and not st["queued"], 60, "the work ahead")
            ed.type(cur, text)  # Tab
            c.call("accepted", {"path": ed.path, "id": "1", "text": text, "accepted": len(text)})
            cur += len(text)
            out = ed.complete(cur)
            # (At most the answer's last token: the answer begun at the Tab's didChange races the
            # accept and sometimes cuts it from the slot; seen before this session's changes too.)
            assert out["source"] == "accept" and out["tokens"]["evaluated"] <= 1, out
            accepts += 1
            ahead += out["tokens"]["evaluated"] == 0
        assert accepts >= 2 and ahead >= 1


def test_a_plan_answered_before_comes_from_the_cache(daemon):
    with daemon.client() as c:
        ed = Editor(c, "undo.py", DOC)
        cur = DOC.index("\n", 1500) + 5
        first = ed.complete(cur)
        ed.type(cur, "#")
        ed.complete(cur + 1)
        ed.version += 1  # undo: the text as it was
        c.call("didChange", {"path": ed.path, "version": ed.version, "contentChanges": [{"text": DOC}]})
        again = ed.complete(cur)
        assert again["source"] == "cache" and again["text"] == first["text"] and again["tokens"]["evaluated"] == 0
