"""Generators nest at most three deep anywhere (issue 40): at every ``llama_decode`` of a real
daemon's work (a file opened, the cursor's prefill and its growth, keystrokes with their requests,
the answers begun at them, growth riding along and idle), the engine thread's stack holds at most two
generator frames (a job's and the decoder's: engine/steps.py), however deep the jobs go; and the
daemon's status shows the jobs idle time runs."""

import inspect
import sys

from efim_local.daemon.client import Client
from efim_local.engine.steps import Steps
from efim_local.llama.context import Context

from tests.helpers import budgeted_engine, in_process_daemon, sources, wait_until


def at_decode(frame) -> tuple[int, tuple[str, ...]]:
    """(generator frames on the stack, the jobs of the Steps being run: outermost first)."""
    depth, jobs = 0, ()
    while frame is not None:
        depth += bool(frame.f_code.co_flags & inspect.CO_GENERATOR)
        owner = frame.f_locals.get("self") if frame.f_code.co_name == "_resume" else None
        if isinstance(owner, Steps) and not jobs:
            jobs = tuple(owner.jobs)
        frame = frame.f_back
    return depth, jobs


def test_generators_nest_at_most_two_deep_at_every_decode(tmp_path, tiny_model, monkeypatch):
    seen: list[tuple[int, tuple[str, ...]]] = []
    plain = Context.decode

    def decode(self, *a, **kw):
        seen.append(at_decode(sys._getframe(1)))
        return plain(self, *a, **kw)

    monkeypatch.setattr(Context, "decode", decode)
    text = sources()[3][:6000]
    shown: list = []  # status's idle_task, as the polls saw it
    with in_process_daemon(tmp_path / "efim.sock", budgeted_engine(tiny_model)) as server:  # plans reduced, growth runs
        with Client(server.sock_path, timeout=120) as c:
            def idle() -> bool:
                s = c.call("status")
                shown.append(s["idle_task"])
                return s["idle_tasks"] == 0 and s["queued"] == 0

            c.call("didOpen", {"path": "a.py", "text": text, "version": 1})
            wait_until(idle, 120, "the open's prefill")
            c.call("cursor", {"path": "a.py", "offset": 3000})
            wait_until(idle, 120, "the cursor's prefill and growth")
            at, version = 3000, 1
            for ch in "def f(x):":  # keystrokes: an edit, then its request
                version += 1
                c.call("didChange", {"path": "a.py", "version": version, "contentChanges": [
                    {"range": {"start": pos(text, at), "end": pos(text, at)}, "text": ch}]})
                text, at = text[:at] + ch + text[at:], at + 1
                assert "text" in c.call("complete", {"path": "a.py", "offset": at, "version": version})
            wait_until(idle, 120, "growth after typing")

    assert seen and max(d for d, _ in seen) <= 2, sorted({s for s in seen if s[0] > 2})
    stacks = {jobs for _, jobs in seen}
    # The work above ran: an opened file's head, the cursor's plan and its growth's stages, requests.
    assert {"Growth.warm_steps", "Runner.planned_steps"} <= {jobs[0] for jobs in stacks if jobs}, stacks
    assert any("Growth.grow_steps" in jobs and "Growth.staged_steps" in jobs for jobs in stacks), stacks
    assert max(map(len, stacks)) >= 4, stacks  # jobs four deep and more ran as data, not as frames
    # Status says what idle time does: the task started, its file, the jobs it runs now.
    warms = [t for t in shown if t and t["task"] == "warm" and t["jobs"]]
    assert warms and all(t["path"] == "a.py" and t["jobs"][0] == "Growth.warm_steps" for t in warms), shown
    assert shown[-1] is None  # idle work rests


def pos(text: str, at: int) -> dict:
    line = text[:at].count("\n")
    return {"line": line, "character": at - (text.rfind("\n", 0, at) + 1)}
