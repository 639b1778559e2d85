"""One writer per piece of per-file state (engine/files.py): while a daemon (in this process, on a real
engine) serves opens, edits, cursor notes, completion requests and background growth, every field of
``FileState`` and of the planner's ``FileSession`` is written by one thread: the document's by the
connection that applies the editor's messages, everything planning reads by the engine thread."""

import threading
from collections import defaultdict

import pytest

from efim_local.daemon.client import Client
from efim_local.engine.files import FileState
from efim_local.prompt.plans import FileSession

from tests.helpers import budgeted_engine, in_process_daemon, sources, wait_until

DOCUMENT = {"text", "version", "open", "edited", "caret"}


class Writers:
    """The threads that wrote each field of ``classes`` after construction (its __init__ is not counted)."""

    def __init__(self, monkeypatch, *classes):
        self.seen: dict[tuple[str, str], set[tuple[int, str]]] = defaultdict(set)
        self.lock = threading.Lock()
        building = threading.local()
        for cls in classes:
            init, setattr_ = cls.__init__, cls.__setattr__

            def wrapped_init(obj, *a, _init=init, **kw):
                building.depth = getattr(building, "depth", 0) + 1
                try:
                    _init(obj, *a, **kw)
                finally:
                    building.depth -= 1

            def wrapped_setattr(obj, name, value, _set=setattr_, _cls=cls):
                if not getattr(building, "depth", 0):
                    t = threading.current_thread()
                    with self.lock:
                        self.seen[(_cls.__name__, name)].add((t.ident, t.name))
                _set(obj, name, value)

            monkeypatch.setattr(cls, "__init__", wrapped_init)
            monkeypatch.setattr(cls, "__setattr__", wrapped_setattr)

    def of(self, cls_name: str, field: str) -> set[int]:
        with self.lock:
            return {ident for ident, _ in self.seen.get((cls_name, field), ())}


@pytest.fixture
def served(tmp_path, tiny_model, monkeypatch):
    writers = Writers(monkeypatch, FileState, FileSession)
    with in_process_daemon(tmp_path / "efim.sock", budgeted_engine(tiny_model)) as server:
        yield server, writers


def idle(c: Client) -> bool:
    s = c.call("status")
    return s["idle_tasks"] == 0 and s["queued"] == 0


def test_every_per_file_field_has_one_writing_thread(served):
    server, writers = served
    text = sources()[3][:5000]
    opened = {}
    with Client(server.sock_path, timeout=120) as editor:
        def record_thread(engine):  # the engine thread's identity (calls run there)
            opened["engine"] = threading.get_ident()

        server.worker.call(record_thread)
        editor.call("didOpen", {"path": "a.py", "text": text, "version": 1})
        editor.call("cursor", {"path": "a.py", "offset": 2500})
        wait_until(lambda: idle(editor), 120, "the open and cursor prefill")
        at, version = 2500, 1
        for ch in "def f(x):":  # keystrokes: an edit, then its request on the document
            line = text[:at].count("\n")
            col = at - (text.rfind("\n", 0, at) + 1)
            version += 1
            editor.call("didChange", {"path": "a.py", "version": version, "contentChanges": [
                {"range": {"start": {"line": line, "character": col}, "end": {"line": line, "character": col}},
                 "text": ch}]})
            text, at = text[:at] + ch + text[at:], at + 1
            out = editor.call("complete", {"path": "a.py", "offset": at, "version": version})
            assert "text" in out
        editor.call("cursor", {"path": "a.py", "offset": 100})
        wait_until(lambda: idle(editor), 120, "growth and the cursor's prefill")
        with Client(server.sock_path, timeout=120) as other:  # a file no editor syncs: its text comes with requests
            other.call("complete", {"path": "b.py", "text": text, "offset": 3000})
            wait_until(lambda: idle(other), 120, "b.py's growth")
        editor.call("didClose", {"path": "a.py"})

    engine = opened["engine"]
    for field in DOCUMENT:
        assert len(writers.of("FileState", field)) == 1, (field, writers.seen[("FileState", field)])
    doc = writers.of("FileState", "text")
    assert doc != {engine} and all(writers.of("FileState", f) == doc for f in DOCUMENT)
    planning = [("FileState", f) for f in ("seen", "cursor", "touched", "session")] + [
        ("FileSession", f) for f in ("anchor", "typed", "layout", "reanchors")]
    for key in planning:
        assert writers.of(*key) == {engine}, (key, writers.seen.get(key))
    # Every field written is one of these, by one thread (near_until, lead, note: when growth or the
    # repository context write them, the engine thread).
    for key, threads in writers.seen.items():
        assert len(threads) == 1, (key, threads)
        if key[0] == "FileSession" or key[1] not in DOCUMENT:
            assert {ident for ident, _ in threads} == {engine}, (key, threads)
