"""A simulated user in the paced replay (issue 24): they take a suggestion when it is what they were
about to type, and otherwise type through it or on.

The replay types the trace's steps at their pace (paced.py). Whenever the user is about to act (the
next step's time) and a suggestion is shown (an answer that arrived before then, for the document
as it is), the user compares it with what they will type next:

- the whole suggestion, else its first line, else its first word, if typing on would reach exactly
  the document that inserting it gives (auto-pairs and all): they **accept** it — the editor
  inserts it (``didChange``), sends ``accepted`` and asks for the next suggestion at once; the steps
  that would have typed it are skipped and the rest of the trace comes that much earlier;
- else, a keystroke that types the suggestion's next character keeps it shown (**type-through**);
  any other keystroke clears it.

Reported: accepts (by form), type-through keystrokes, the sources of the daemon's answers, and the
time to the next suggestion after an accept (at the client: the request sent to its first text;
in the daemon: its ``timings.total_ms``).
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass

from ..engine.stream import typed_over
from . import util as bu
from .editors import EfimEditor, Fired, Outcome, Step, _position, spawn_efim

WORD = re.compile(r"\s*\w+|\s*\W")  # the first word, or the first other character, after spaces


@dataclass
class Ghost:
    """The suggestion shown: the rest of an answer at ``cursor`` of ``doc``."""

    doc: str
    cursor: int
    text: str
    replaces: int = 0  # the closers after the cursor it types over

    def taking(self, text: str) -> int:
        """How many characters after the cursor taking ``text`` (a form of it) replaces."""
        return typed_over(text, self.doc[self.cursor:self.cursor + self.replaces])[0]


def forms(text: str) -> list[tuple[str, str]]:
    """The accepts a user may make of a suggestion, longest first: (form, text inserted)."""
    out = [("full", text)]
    nl = text.find("\n")
    if 0 < nl < len(text) - 1:
        out.append(("line", text[:nl]))
    m = WORD.match(text)
    if m and m.end() < len(out[-1][1]):
        out.append(("word", m.group()))
    return [(f, t) for f, t in out if t]


def accept_match(steps: list[Step], i: int, ghost: Ghost) -> tuple[int, str, str] | None:
    """(the step whose document accepting gives, form, text) if typing on from step ``i`` reaches
    exactly what accepting some form of ``ghost`` inserts; None if it does not."""
    for form, text in forms(ghost.text):
        doc = ghost.doc[:ghost.cursor] + text + ghost.doc[ghost.cursor + ghost.taking(text):]
        cur = ghost.cursor + len(text)
        for m in range(i, len(steps)):
            s = steps[m]
            if s.kind not in ("key", "over", "cleanup") or len(s.doc) > len(doc) + 8:
                break
            if s.cursor == cur and s.doc == doc:
                return m, form, text
    return None


def user_replay(editor: EfimEditor, steps: list[Step], debounce_s: float, limit: int | None = None,
                patient_s: float = 0.0, read_s: float = 0.4) -> dict:
    """Play ``steps`` in real time with a user who accepts matching suggestions; the report.
    ``patient_s`` > 0: the user waits up to that long for each suggestion, then reads it for
    ``read_s`` (the daemon computes ahead meanwhile), and the rest of the trace comes that much later
    (a slow or loaded machine still shows the accept path)."""
    t0 = time.perf_counter()
    shift, prev, ghost = 0.0, None, None
    running: tuple[threading.Thread, Outcome, Fired] | None = None
    rows, accepts, through, n_fired = [], [], 0, 0
    i = 0
    while i < len(steps) and (limit is None or n_fired < limit):
        s = steps[i]
        _sleep_until(t0 + s.t - shift)
        if running is not None:  # the suggestion, if its answer came in time
            th, out, f = running
            if th.is_alive():
                editor.cancel(th)  # the user acts first: no suggestion (not waited for, as in paced.replay)
            elif out.text and prev is not None and f.doc == prev.doc and f.cursor == prev.cursor:
                ghost = Ghost(f.doc, f.cursor, out.text, out.replaces)
            running = None
        hit = accept_match(steps, i, ghost) if ghost is not None and s.kind in ("key", "over") else None
        if hit is not None:
            m, form, text = hit
            out, f = _accept(editor, prev, ghost, text, steps[m])
            accepts.append({"form": form, "chars": len(text), "source": out.source, "total_ms": out.total_ms,
                            "first_text_ms": (out.t_first - out.t_send) * 1e3 if out.t_first else None,
                            "ready_ms": (out.t_done - out.t_send) * 1e3 if out.t_done else None})
            rows.append(_row(f, out, after_accept=True))
            n_fired += 1
            shift += steps[m].t - s.t  # the typing it saved
            prev, ghost = steps[m], (Ghost(f.doc, f.cursor, out.text, out.replaces) if out.text else None)
            i = m + 1
            if patient_s > 0 and ghost is not None and i < len(steps):
                shift = _wait(None, out, patient_s, read_s, t0 + steps[i].t - shift, shift)
            continue
        if ghost is not None:  # typing the suggestion's next character keeps it shown
            ch = s.change[2] if s.change else None
            if s.kind == "key" and ch and ghost.text.startswith(ch[:1]) and s.cursor == ghost.cursor + 1:
                through += 1
                ghost = Ghost(s.doc, s.cursor, ghost.text[1:], ghost.replaces) if len(ghost.text) > 1 else None
            else:
                ghost = None
        editor.event(s, prev)
        prev = s
        nxt = steps[i + 1].t if i + 1 < len(steps) else float("inf")
        if s.kind in ("key", "over", "jump") and nxt - s.t > debounce_s:
            _sleep_until(t0 + s.t + debounce_s - shift)
            f = Fired(i, s.t + debounce_s - shift, s.path, s.doc, s.cursor, nxt - shift)
            out = Outcome(time.perf_counter())
            th = threading.Thread(target=editor.fire, args=(f, out), daemon=True)
            th.start()
            running = (th, out, f)
            rows.append(_row(f, out))
            n_fired += 1
            if patient_s > 0:
                shift = _wait(th, out, patient_s, read_s, t0 + nxt - shift, shift)
        i += 1
    if running is not None:
        running[0].join(120)
    return summarize_user(rows, accepts, through)


def _wait(th, out: Outcome, patient_s: float, read_s: float, next_at: float, shift: float) -> float:
    """A patient user: wait for the answer, read it; the shift that puts the next step after that."""
    if th is not None:
        th.join(patient_s)
    if out.text:
        time.sleep(read_s)
    late = time.perf_counter() + 0.01 - next_at
    return shift - late if late > 0 else shift


def _accept(editor: EfimEditor, prev: Step, ghost: Ghost, text: str, to: Step) -> tuple[Outcome, Fired]:
    """Insert ``text`` as an editor's accept does, say so, and ask for the next suggestion."""
    editor.version += 1
    pos = _position(ghost.doc, ghost.cursor)
    end = _position(ghost.doc, ghost.cursor + ghost.taking(text))
    editor.ctl.call("didChange", {"path": to.path, "version": editor.version, "contentChanges": [
        {"range": {"start": pos, "end": end}, "text": text}]})
    editor.versions[id(to.doc)] = editor.version
    editor.ctl.notify("accepted", {"path": to.path, "id": "0", "text": ghost.text, "accepted": len(text)})
    f = Fired(-1, 0.0, to.path, to.doc, to.cursor, float("inf"))
    out = Outcome(time.perf_counter())
    editor.fire(f, out)  # waited for: the user looks for the next suggestion
    return out, f


def _row(f: Fired, out: Outcome, after_accept: bool = False) -> dict:
    return {"path": f.path, "after_accept": after_accept, "outcome": out}


def summarize_user(rows: list[dict], accepts: list[dict], through: int) -> dict:
    """Counts and times of a simulated user's replay."""
    sources: dict[str, int] = {}
    for r in rows:
        src = r["outcome"].source or ("cancelled" if r["outcome"].cancelled else "none")
        sources[src] = sources.get(src, 0) + 1
    ready = [a["total_ms"] for a in accepts if a["total_ms"] is not None]
    client = [a["first_text_ms"] or a["ready_ms"] for a in accepts if (a["first_text_ms"] or a["ready_ms"])]
    return {"requests": len(rows), "accepts": len(accepts),
            "accepts_by_form": {f: sum(a["form"] == f for a in accepts) for f in ("full", "line", "word")},
            "accepted_chars": sum(a["chars"] for a in accepts), "type_through_keys": through,
            "sources": sources, "after_accept_sources": _count(a["source"] for a in accepts),
            "after_accept_ready_5ms": sum(x <= 5 for x in ready) / len(ready) if ready else None,
            "after_accept_daemon_p50_ms": bu.pctl(ready, 0.5), "after_accept_daemon_p95_ms": bu.pctl(ready, 0.95),
            "after_accept_client_p50_ms": bu.pctl(client, 0.5), "after_accept_client_p95_ms": bu.pctl(client, 0.95),
            "accepts_detail": accepts}


def _count(xs) -> dict:
    out: dict = {}
    for x in xs:
        out[str(x)] = out.get(str(x), 0) + 1
    return out


def _sleep_until(t: float) -> None:
    delay = t - time.perf_counter()
    if delay > 0:
        time.sleep(delay)


def run_user(cfg, trace_steps: list[Step], patient_s: float = 0.0) -> dict:
    """The simulated user's replay of ``trace_steps`` against a fresh daemon (paced.PacedConfig);
    ``patient_s``: see :func:`user_replay`."""
    proc, ed = spawn_efim(cfg)
    try:
        res = user_replay(ed, trace_steps, cfg.pacing.debounce_s, cfg.max_requests, patient_s)
        res["engine_time_s"] = ed.ctl.call("status").get("engine_time_s", {})
        return res
    finally:
        ed.close()
        proc.terminate()
        proc.wait(30)

