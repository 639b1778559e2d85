"""An answer begun at the keystroke (``FollowUp.typed``, ``Runner.keystroke_steps``), over a real socket:
an edit that leaves the shown answer starts the answer at its caret in idle time, with the options of
the file's last request; the request that comes after the editor's debounce takes it over (source
"keystroke", nothing evaluated, its first tokens already generated) and equals the same plan computed
cold (hypothesis, on the batch-invariant f32 tiny model)."""


import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from efim_local.daemon.client import Client
from efim_local.engine import Engine
from efim_local.request import Options

from tests.helpers import in_process_daemon, small_config, sources, wait_until

CFG = dict(n_ctx_seq=2048, max_tokens=12, heal=True)


@pytest.fixture(scope="module")
def served(tiny_model, tmp_path_factory):
    engine = Engine(small_config(**CFG), tiny_model)
    with in_process_daemon(tmp_path_factory.mktemp("keystroke") / "efim.sock", engine) as server:
        yield server


@pytest.fixture(scope="module")
def reference(tiny_model):
    with Engine(small_config(n_slots=1, **CFG), tiny_model) as e:
        yield e


def idle(c: Client) -> bool:
    s = c.call("status")
    return s["idle_tasks"] == 0 and s["queued"] == 0


def position(text: str, at: int) -> dict:
    return {"line": text.count("\n", 0, at), "character": at - (text.rfind("\n", 0, at) + 1)}


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                HealthCheck.too_slow])
@given(i=st.integers(0, 5), at=st.integers(300, 2500), key=st.sampled_from(["x", "=", " ", ".", "\n", "()", '""']))
def test_the_request_after_a_keystroke_takes_the_answer_begun_at_it(served, reference, i, at, key):
    src = sources()[i][:3000]
    cur = min(src.index("\n", at) + 1 + 4, len(src))  # four characters into a line
    path = f"keystroke-{i}-{at}-{ord(key[0])}.py"
    with Client(served.sock_path, timeout=120) as c:
        c.call("didOpen", {"path": path, "text": src, "version": 1})
        first = c.call("complete", {"path": path, "offset": cur, "version": 1})
        assume(not first["text"].startswith(key[0]))  # a key that types on the answer types through it
        wait_until(lambda: idle(c), 120, "the answer's continuation")
        c.call("didChange", {"path": path, "version": 2, "contentChanges": [
            {"range": {"start": position(src, cur), "end": position(src, cur)}, "text": key}]})
        text, caret = src[:cur] + key + src[cur:], cur + 1  # an auto-paired opener: the caret between the two
        wait_until(lambda: idle(c), 120, "the keystroke's answer")
        out = c.call("complete", {"path": path, "offset": caret, "version": 2})
        s = served.worker.call(lambda e: e.instant.shown[path])  # the plan it answered
        assert (s.text, s.cursor) == (text, caret)
        c.call("didClose", {"path": path})
    assert out["source"] == "keystroke" and out["tokens"]["evaluated"] == 0, out
    want = reference.run(s.prompt, Options(), cold=True, heal=s.heal, closers=s.closers)
    assert out["text"] == want.text, (key, out["text"], want.text)


def test_a_keystroke_that_types_on_the_answer_extends_its_trail_instead(served):
    """Typing the shown answer's first character: no new answer starts; the request after it types
    through the trail."""
    src = sources()[2][:3000]
    cur = src.index("\n", 1200) + 1 + 4
    path = "keystroke-through.py"
    with Client(served.sock_path, timeout=120) as c:
        c.call("didOpen", {"path": path, "text": src, "version": 1})
        first = c.call("complete", {"path": path, "offset": cur, "version": 1})
        assert first["text"] and first["text"][0] not in "\ufffd"
        wait_until(lambda: idle(c), 120, "the answer's continuation")
        c.call("didChange", {"path": path, "version": 2, "contentChanges": [
            {"range": {"start": position(src, cur), "end": position(src, cur)}, "text": first["text"][0]}]})
        wait_until(lambda: idle(c), 120, "the keystroke's work")
        out = c.call("complete", {"path": path, "offset": cur + 1, "version": 2})
        c.call("didClose", {"path": path})
    assert out["source"] in ("type-through", "accept") and out["tokens"]["evaluated"] == 0, out
    assert (first["text"][1:]).startswith(out["text"]) or out["text"].startswith(first["text"][1:]), out
