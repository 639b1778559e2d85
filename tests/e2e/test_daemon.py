"""The daemon over a real Unix socket, with the real tiny model, in a real subprocess."""

import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from efim_local import errors as P
from efim_local.errors import EfimError

from tests.helpers import ROOT, SOURCES, Daemon, wait_until

LONG = SOURCES[6][:6000]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, tiny_model):
    d = Daemon(tmp_path_factory.mktemp("daemon"), tiny_model, "--queue-size", "4").start()
    yield d
    d.stop()


def complete(c, text=LONG, offset=3000, path="a.py", **kw):
    return c.call("complete", {"path": path, "text": text, "offset": offset, "max_tokens": 8, **kw})


def test_complete_over_socket(daemon):
    with daemon.client() as c:
        a = complete(c, path="sock.py")
        assert set(a) >= {"text", "stop_reason", "layout", "tokens", "timings", "cache_tier", "reanchor"}
        assert a["reanchor"] == "new_session" and a["cache_tier"] == "none"
        assert a["source"] == "computed"
        b = complete(c, path="sock.py", max_tokens=9)  # (the same request again: the answer cache)
        # (the slot holds the prompt, and the logits after it: Decoder.kept_logits)
        assert b["cache_tier"] == "slot" and b["tokens"]["evaluated"] == 0 and b["text"].startswith(a["text"])
        line = LONG[:3000].count("\n")
        char = 3000 - (LONG.rfind("\n", 0, 3000) + 1)
        pos = c.call("complete", {"path": "sock.py", "text": LONG, "position": {"line": line, "character": char},
                                  "max_tokens": 8})
        assert pos["text"] == a["text"]


def test_synced_document_and_streaming(daemon):
    with daemon.client() as c:
        c.call("didOpen", {"path": "doc.py", "text": LONG[:2000], "version": 1})
        # Type "abc" at line 3, character 0, as an editor's incremental change.
        c.call("didChange", {"path": "doc.py", "version": 2, "contentChanges": [
            {"range": {"start": {"line": 3, "character": 0}, "end": {"line": 3, "character": 0}}, "text": "abc"}]})
        lines = LONG[:2000].split("\n")
        lines[3] = "abc" + lines[3]
        text = "\n".join(lines)
        parts = []
        out = c.call("complete", {"path": "doc.py", "position": {"line": 3, "character": 3}, "max_tokens": 12,
                                  "stream": True}, on_notification=lambda m: parts.append(m["params"]["text"]))
        assert "".join(parts) == out["text"]
        ref = complete(c, text=text, offset=text.index("abc") + 3, path="doc-ref.py", max_tokens=12)
        assert ref["text"] == out["text"]
        c.call("didClose", {"path": "doc.py"})
        with pytest.raises(EfimError) as e:
            c.call("complete", {"path": "doc.py", "offset": 0})
        assert e.value.code == P.INVALID_PARAMS and "not open" in e.value.message


def test_the_daemon_learns_the_editors_debounce(daemon):
    """An editor that asks for a completion 120 ms after each keystroke: after a few requests the
    daemon knows no request comes sooner (status ``editor_debounce_ms``; the engine's idle work sizes
    its batches by it: tests/engine/test_interrupt.py). Enough requests that those of the other tests,
    which may ask at once, are forgotten."""
    from efim_local.engine.policy import Policy

    with daemon.client() as c:
        c.call("didOpen", {"path": "paced.py", "text": LONG[:1500], "version": 1})
        for v in range(2, Policy().debounce_samples + 3):
            c.call("didChange", {"path": "paced.py", "version": v, "contentChanges": [
                {"range": {"start": {"line": 2, "character": 0}, "end": {"line": 2, "character": 0}}, "text": "x"}]})
            time.sleep(0.12)
            c.call("complete", {"path": "paced.py", "position": {"line": 2, "character": v - 1}, "max_tokens": 2})
        assert 115 <= c.call("status")["editor_debounce_ms"] <= 400
        c.call("didClose", {"path": "paced.py"})


def raw_exchange(daemon, frames: list[bytes], wait_for=1) -> list[dict]:
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(daemon.sock))
        s.settimeout(30)
        s.sendall(b"".join(frames))
        f = s.makefile("rb")
        return [json.loads(f.readline()) for _ in range(wait_for)]


@pytest.mark.parametrize("frame,code", [
    (b"{not json\n", P.PARSE_ERROR),
    (b"\xff\xfe\n", P.PARSE_ERROR),
    (b"[1, 2]\n", P.INVALID_REQUEST),
    (b'{"jsonrpc": "1.0", "id": 1, "method": "status"}\n', P.INVALID_REQUEST),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "nope"}\n', P.METHOD_NOT_FOUND),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "complete", "params": []}\n', P.INVALID_PARAMS),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "complete", "params": {"path": 3}}\n', P.INVALID_PARAMS),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "complete", "params": {"path": "x", "text": "ab", "offset": 99}}\n', P.INVALID_PARAMS),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "complete", "params": {"path": "x", "text": "ab", "offset": 1, "max_tokens": 1e300}}\n', P.INVALID_PARAMS),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "complete", "params": {"path": "x", "text": "ab", "offset": 1, "max_tokens": 99999999999999999999999}}\n', P.INVALID_PARAMS),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "complete", "params": {"path": "x", "text": "ab", "position": {"line": 5, "character": 0}}}\n', P.INVALID_PARAMS),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "didChange", "params": {"path": "never-opened"}}\n', P.INVALID_PARAMS),
    (b"[" * 100000 + b"\n", P.PARSE_ERROR),
])
def test_bad_frames_get_errors_and_connection_survives(daemon, frame, code):
    ok = b'{"jsonrpc": "2.0", "id": "after", "method": "status"}\n'
    err, after = raw_exchange(daemon, [frame, ok], wait_for=2)
    assert err["error"]["code"] == code and "Traceback" not in err["error"]["message"]
    assert after["id"] == "after" and after["result"]["pid"] > 0


def test_oversized_frame(daemon):
    big = b'{"jsonrpc": "2.0", "id": 1, "method": "status", "params": {"x": "' + b"a" * (9 << 20) + b'"}}\n'
    err, after = raw_exchange(daemon, [big, b'{"jsonrpc": "2.0", "id": 2, "method": "status"}\n'], wait_for=2)
    assert err["error"]["code"] == P.REQUEST_TOO_LARGE and after["id"] == 2


def test_notifications_get_no_reply(daemon):
    frames = [b'{"jsonrpc": "2.0", "method": "didOpen", "params": {"path": "n.py", "text": "x"}}\n',
              b'{"jsonrpc": "2.0", "method": "nope"}\n',
              b'{"jsonrpc": "2.0", "id": 7, "method": "status"}\n']
    (reply,) = raw_exchange(daemon, frames, wait_for=1)
    assert reply["id"] == 7 and reply["result"]["documents"] >= 1


def test_concurrent_clients(daemon):
    errors, done = [], []

    def client(i):
        try:
            with daemon.client() as c:
                for k in range(8):
                    out = complete(c, path=f"c{i}.py", offset=1000 + 10 * k)
                    done.append(out["tokens"]["generated"])
        except Exception as e:  # noqa: BLE001 - collected for the assert
            errors.append(repr(e))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    busy = [e for e in errors if "busy" in e]
    assert errors == busy and len(done) + len(busy) == 32 and len(done) >= 16


def test_more_files_at_once_than_slots(tmp_path, tiny_model):
    """Eight files completed at once on four slots (the default; the queue holds 16): the requests beyond
    the slots wait for one, and every one gets its answer (it was "internal error: max() arg is an empty
    sequence")."""
    daemon = Daemon(tmp_path, tiny_model).start()
    try:
        _many_at_once(daemon)
    finally:
        daemon.stop()


def _many_at_once(daemon):
    with daemon.client() as c:
        slots = c.call("status", {})["n_slots"]
    go, outs, errors = threading.Barrier(2 * slots), [], []

    def client(i):
        try:
            with daemon.client() as c:
                go.wait(30)
                outs.append(complete(c, path=f"many{i}.py", offset=2000 + 50 * i, max_tokens=32))
        except Exception as e:  # noqa: BLE001 - collected for the assert
            errors.append(repr(e))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(2 * slots)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == [] and len(outs) == 2 * slots
    with daemon.client() as c:
        assert c.call("status", {})["errors"] == 0


def test_a_connection_that_ends_closes_the_documents_it_opened(daemon):
    """An editor that quits without didClose (or forgets a buffer) left its documents open for good: at
    256 the daemon refused every new file. Those no other connection has open are closed with it."""
    def n_open():
        with daemon.client() as c:
            return c.call("status", {})["documents"]

    before = n_open()
    with daemon.client() as a, daemon.client() as b:
        for name in ("left1.py", "left2.py", "shared.py"):
            a.call("didOpen", {"path": name, "text": "x = 1\n"})
        b.call("didOpen", {"path": "shared.py", "text": "x = 1\n"})
        a.call("didClose", {"path": "left2.py"})
        assert n_open() == before + 2  # left1.py, shared.py
    assert wait_until(lambda: n_open() == before)  # a's own, and shared.py once b ended too
    with daemon.client() as a:
        a.call("didOpen", {"path": "kept.py", "text": "x = 1\n"})
        with daemon.client() as b:
            b.call("didOpen", {"path": "kept.py", "text": "x = 1\n"})
        assert n_open() == before + 1  # a still has it open
        assert a.call("complete", {"path": "kept.py", "offset": 5, "max_tokens": 4})["tokens"]["prompt"] > 0


def test_supersede_and_cancel(daemon):
    with daemon.client() as c:
        for rid in (1, 2):  # two requests for the same document, back to back
            c.send({"jsonrpc": "2.0", "id": rid, "method": "complete",
                    "params": {"path": "sup.py", "text": LONG, "offset": 4000 + rid, "max_tokens": 400}})
        replies = {m["id"]: m for m in (c.read(), c.read())}
        assert replies[1]["error"]["code"] == P.CANCELLED
        assert "result" in replies[2]
        # The first request's prompt work stayed: the second one reused the slot.
        c.send({"jsonrpc": "2.0", "id": 3, "method": "complete",
                "params": {"path": "can.py", "text": LONG, "offset": 5000, "max_tokens": 200}})
        c.send({"jsonrpc": "2.0", "id": 4, "method": "cancel", "params": {"id": 3}})
        replies = {m["id"]: m for m in (c.read(), c.read())}
        assert replies[4]["result"] == {"cancelled": True}
        assert replies[3]["error"]["code"] == P.CANCELLED


def test_cancel_takes_a_waiting_request_from_the_queue(tmp_path, tiny_model):
    """A request waiting for a slot (every slot runs another file's request) is cancelled at once:
    its "cancelled" goes out from the connection that cancelled it, before the running ones end, and
    they are answered as usual."""
    d = Daemon(tmp_path, tiny_model, "--queue-size", "8", config="n_slots = 2\n").start()
    try:
        with d.client() as c:
            for rid in range(3):  # two slots: the third file's request waits
                c.send({"jsonrpc": "2.0", "id": rid, "method": "complete",
                        "params": {"path": f"wait{rid}.py", "text": LONG, "offset": 3000 + rid, "max_tokens": 300,
                                   "ignore_eog": True}})
            c.send({"jsonrpc": "2.0", "id": 9, "method": "cancel", "params": {"id": 2}})
            order = [c.read() for _ in range(4)]
    finally:
        d.stop()
    replies = {m["id"]: m for m in order}
    assert replies[9]["result"] == {"cancelled": True}
    assert replies[2]["error"]["code"] == P.CANCELLED
    assert all("result" in replies[i] for i in range(2))
    ids = [m["id"] for m in order]
    assert ids.index(2) < min(ids.index(i) for i in range(2))  # taken from the queue, not ended running


def test_busy_when_queue_full(daemon):
    with daemon.client() as c:
        for i in range(12):
            c.send({"jsonrpc": "2.0", "id": i, "method": "complete",
                    "params": {"path": f"busy{i}.py", "text": LONG, "offset": 3000, "max_tokens": 200}})
        replies = [c.read() for _ in range(12)]
    codes = [r.get("error", {}).get("code") for r in replies]
    assert P.BUSY in codes and codes.count(None) >= 4


# Lone surrogates (valid JSON, not UTF-8) and NaN/Infinity (Python's JSON reads them) in every field.
SURROGATES = st.sampled_from(["\ud800", "x\udfffy", "\udc80.py"])
ATOMS = st.one_of(st.none(), st.booleans(), st.integers(-(2 ** 70), 2 ** 70), st.floats(), SURROGATES,
                  st.text(max_size=20), st.sampled_from(["complete", "didOpen", "didChange", "status", "cancel", "x"]))
JSONISH = st.recursive(ATOMS, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                      st.dictionaries(st.text(max_size=8), kids, max_size=4)), max_leaves=12)
KEYS = st.sampled_from(["path", "text", "offset", "position", "max_tokens", "temperature", "layout", "stream",
                        "contentChanges", "id", "line", "character", "range", "version"])
PARAMS = st.dictionaries(KEYS, JSONISH, max_size=6)
REQUESTS = st.fixed_dictionaries({"jsonrpc": st.sampled_from(["2.0", "2.0", "1.0", 2]),
                                  "method": st.sampled_from(["complete", "didOpen", "didChange", "didClose", "cancel", "status", "nope", 5,
                                                             "\ud800"]),
                                  "params": st.one_of(PARAMS, JSONISH)},
                                 optional={"id": st.one_of(st.integers(-5, 10 ** 20), st.text(max_size=5), st.none(),
                                                           st.lists(st.integers()), SURROGATES)})
GARBAGE = st.one_of(
    st.binary(max_size=64).map(lambda b: b.replace(b"\n", b" ")),
    JSONISH.map(lambda v: json.dumps(v).encode()),
    REQUESTS.map(lambda v: json.dumps(v).encode()),
)
# Well-formed requests that reach the handlers and the engine, on two documents: the daemon must
# answer each one that has an id exactly once (a result or an error: invalid range, busy, cancelled...).
FZ_PATH = st.sampled_from(["fz1.py", "fz2.py", "fz1.py", "fz2.py", "fz\ud800.py", "fz\x00.py"])
FZ_TEXT = st.one_of(st.text("ab (\n\té", max_size=30), st.text("ab\n\ud800", max_size=8))
FZ_POS = st.fixed_dictionaries({"line": st.integers(0, 3), "character": st.integers(0, 6)})
VALID = st.one_of(
    st.tuples(st.just("didOpen"), st.fixed_dictionaries({"path": FZ_PATH, "text": FZ_TEXT, "version": st.integers(0, 9)},
                                                        optional={"root": st.sampled_from(["/tmp\x00x", "\ud800"])})),
    st.tuples(st.just("didChange"), st.fixed_dictionaries({"path": FZ_PATH, "contentChanges": st.lists(
        st.fixed_dictionaries({"range": st.fixed_dictionaries({"start": FZ_POS, "end": FZ_POS}), "text": FZ_TEXT}),
        max_size=2)})),
    st.tuples(st.just("didClose"), st.fixed_dictionaries({"path": FZ_PATH})),
    st.tuples(st.just("cursor"), st.fixed_dictionaries({"path": FZ_PATH, "position": FZ_POS})),
    st.tuples(st.just("complete"), FZ_TEXT.flatmap(lambda t: st.fixed_dictionaries({
        "path": FZ_PATH, "text": st.just(t), "offset": st.integers(0, len(t)), "max_tokens": st.integers(0, 2),
        "layout": st.sampled_from(["efim", "fim"]), "stream": st.booleans(),
        "temperature": st.sampled_from([0.0, 0.0, float("nan"), float("inf")])}))),
    st.tuples(st.just("complete"), st.fixed_dictionaries({"path": FZ_PATH, "position": FZ_POS,
                                                          "max_tokens": st.integers(0, 2)})),
    st.tuples(st.just("cancel"), st.fixed_dictionaries({"id": st.integers(0, 49).map(lambda k: f"valid-{k}")})),
    st.tuples(st.just("status"), st.just({})),
)
FRAMES = st.one_of(GARBAGE.map(lambda b: ("raw", b)), st.tuples(VALID, st.booleans()).map(lambda v: ("valid", *v)))
CODES = {P.PARSE_ERROR, P.INVALID_REQUEST, P.METHOD_NOT_FOUND, P.INVALID_PARAMS, P.BUSY, P.MODEL_ERROR,
         P.REQUEST_TOO_LARGE, P.CANCELLED}  # never INTERNAL_ERROR: that is a bug


@settings(max_examples=60, suppress_health_check=[
    HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large])
@given(frames=st.lists(FRAMES, min_size=50, max_size=50))
def test_fuzz_daemon_survives(daemon, frames):
    """60 examples x 50 frames: random and malformed frames mixed with well-formed requests."""
    wire, expected = [], set()
    for k, frame in enumerate(frames):
        if frame[0] == "raw":
            wire.append(frame[1])
            continue
        (method, params), notify = frame[1:]
        msg = {"jsonrpc": "2.0", "method": method, "params": params}
        if not notify:
            msg["id"] = f"valid-{k}"
            expected.add(msg["id"])
        wire.append(json.dumps(msg).encode())
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(daemon.sock))
        s.settimeout(60)
        probe = b'{"jsonrpc": "2.0", "id": "probe-after-fuzz", "method": "status"}\n'
        s.sendall(b"\n".join(wire) + b"\n" + probe)
        f = s.makefile("rb")
        replied, probed = [], False
        while not probed or not expected <= set(replied):  # deferred completions may answer after the probe
            line = f.readline()
            assert line, "daemon closed the connection"
            msg = json.loads(line)
            if "id" not in msg:
                assert msg.get("method"), msg  # a notification (streamed text)
                continue
            assert msg["jsonrpc"] == "2.0" and ("result" in msg) != ("error" in msg), msg
            if "error" in msg:
                err = msg["error"]
                assert err["code"] in CODES and "Traceback" not in err["message"] and "\n" not in err["message"], msg
            if msg["id"] == "probe-after-fuzz":
                assert msg["result"]["pid"] > 0
                probed = True
            elif isinstance(msg["id"], str) and msg["id"].startswith("valid-"):
                replied.append(msg["id"])
    assert sorted(replied) == sorted(expected)  # each request exactly one reply
    assert daemon.proc.poll() is None


def test_socket_permissions(daemon):
    assert oct(daemon.sock.stat().st_mode & 0o777) == "0o600"
    assert oct(daemon.sock.parent.stat().st_mode & 0o777) == "0o700"


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to run a child under another uid")
def test_foreign_uid_is_refused(tiny_model):
    import shutil
    import tempfile
    from pathlib import Path

    base = Path(tempfile.mkdtemp(prefix="efim-uid-", dir="/tmp"))
    os.chmod(base, 0o711)  # traversable, so only the daemon's own permissions and checks stand in the way
    daemon = Daemon(base, tiny_model).start()
    child = (
        "import os, socket, sys\n"
        "os.setgid(65534); os.setuid(65534)\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        "try:\n"
        "    s.connect(sys.argv[1])\n"
        "except PermissionError:\n"
        "    print('denied'); sys.exit(0)\n"
        "try:\n"
        "    s.sendall(b'{\"jsonrpc\": \"2.0\", \"id\": 1, \"method\": \"status\"}\\n')\n"
        "    print('eof' if s.recv(100) == b'' else 'answered')\n"
        "except (ConnectionResetError, BrokenPipeError):\n"
        "    print('eof')\n")
    run = lambda: subprocess.run([sys.executable, "-c", child, str(daemon.sock)], capture_output=True, timeout=30,
                                 text=True).stdout.strip()
    try:
        assert run() == "denied"  # the 0700 directory and 0600 socket stop it first
        # Even if the permissions were loosened, the peer-uid check refuses it.
        os.chmod(daemon.sock.parent, 0o711)
        os.chmod(daemon.sock, 0o666)
        assert run() == "eof"
        with daemon.client() as c:  # and the owner is still served
            assert c.call("status")["pid"] > 0
    finally:
        daemon.stop()
        shutil.rmtree(base, ignore_errors=True)


def test_second_daemon_refused_and_stale_socket_replaced(tmp_path, tiny_model):
    d = Daemon(tmp_path, tiny_model)
    d.sock.parent.mkdir(parents=True, mode=0o700)
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(d.sock))  # a socket file nobody listens on: a crashed daemon's
    stale.close()
    d.start()
    try:
        second = subprocess.run(d.args, env=d.env, cwd=ROOT, capture_output=True, timeout=60)
        assert second.returncode == 1 and b"another efim daemon is running" in second.stderr
    finally:
        d.stop()


def test_restart_restores_warm_state(tmp_path, tiny_model):
    d = Daemon(tmp_path, tiny_model).start()
    with d.client() as c:
        first = complete(c, path="warm.py")
    d.stop()  # saves its slots to disk
    d.start()
    try:
        with d.client() as c:
            again = complete(c, path="warm.py")
        assert again["cache_tier"] == "disk" and again["tokens"]["evaluated"] == 1
        assert again["text"] == first["text"]
    finally:
        d.stop()


def test_watcher_refreshes_changed_files(tmp_path, tiny_model):
    root = tmp_path / "ws"
    root.mkdir()
    f = root / "mod.py"
    f.write_text(LONG[:3000])
    d = Daemon(tmp_path, tiny_model, "--watch", str(root)).start()
    try:
        with d.client() as c:
            complete(c, text=f.read_text(), offset=2000, path=str(f))
            before = {s["tokens"] for s in c.call("status")["slots"] if s["path"] == str(f)}
            new = "# reformatted\n" + LONG[:3000]
            f.write_text(new)  # a formatter or a git checkout changes it on disk
            deadline = time.monotonic() + 90  # idle work yields to every status call: slow on a loaded machine
            while time.monotonic() < deadline:
                # Wait for the refreshed session (another token count, idle work done), not the old one.
                st = c.call("status")
                if any(s["path"] == str(f) and s["tokens"] > 500 and s["tokens"] not in before for s in st["slots"]) \
                        and st["queued"] == 0 and st["idle_tasks"] == 0:
                    break
                time.sleep(0.25)
            out = complete(c, text=new, offset=2000, path=str(f))
            # The change was at the file's start, so only a refreshed session prefilled
            # while idle can leave a single token to evaluate.
            assert out["cache_tier"] == "slot" and out["tokens"]["evaluated"] == 1
    finally:
        d.stop()



def test_files_the_daemon_never_served_and_its_own_files_cost_no_engine_work(tmp_path, tiny_model):
    """A watched root that holds a log another program appends to, and the daemon's own state (its log,
    its saved states: a workspace with the XDG directories inside it): their writes refresh nothing,
    warm nothing and never stop the engine's idle work (the daemon's own log once fed the watcher
    a change per line it wrote, each stopping the idle work that logged the next). A file the daemon
    served is still refreshed (test_watcher_refreshes_changed_files)."""
    root = tmp_path  # (Daemon puts the state, cache and runtime directories under it)
    (root / "mod.py").write_text(LONG[:3000])
    d = Daemon(tmp_path, tiny_model, "--watch", str(root)).start()
    app_log = root / "app.log"

    def idle(c):
        st = c.call("status")
        return st if st["queued"] == 0 and st["idle_tasks"] == 0 else None

    try:
        with d.client() as c:
            complete(c, text=LONG[:3000], offset=2000, path=str(root / "mod.py"))
            wait_until(lambda: idle(c), 90, "the daemon idle after its request")
            with app_log.open("a") as f:
                for i in range(40):  # a dev server's log
                    f.write(f"GET /item/{i} 200 ({i} ms)\n")
                    f.flush()
                    time.sleep(0.02)
            time.sleep(1.0)  # (the watcher's events arrive)
            st = wait_until(lambda: idle(c), 90, "the daemon idle after the writes")
            paths = {s["path"] for s in st["slots"]}
            assert str(app_log) not in paths and not any(p and p.startswith(str(tmp_path / "state")) for p in paths)
            time_before = st["engine_time_s"]
            time.sleep(2.0)  # idle stays idle: nothing the daemon writes itself comes back as work
            after = c.call("status")["engine_time_s"]
            busy = {k: round(after.get(k, 0) - v, 2) for k, v in time_before.items() if after.get(k, 0) - v > 0.05}
            assert not busy and set(after) == set(time_before), (time_before, after)
    finally:
        d.stop()

@pytest.mark.parametrize("frame", [
    b'{"jsonrpc": "2.0", "id": "\\ud800", "method": "complete", "params": {"path": "s.py", "text": "x = 1\\n", "offset": 3}}\n',
    b'{"jsonrpc": "2.0", "id": 5, "method": "complete", "params": {"path": "s.py", "text": "x = \\ud800\\n", "offset": 3}}\n',
    b'{"jsonrpc": "2.0", "id": "\\udfff", "method": "status"}\n',
])
def test_lone_surrogates_get_a_reply_and_the_engine_lives_on(daemon, frame):
    """A lone surrogate (valid JSON, not UTF-8) once killed the engine thread for good."""
    reply, = raw_exchange(daemon, [frame])
    assert "result" in reply or "error" in reply
    with daemon.client() as c:  # the engine thread still answers
        assert complete(c, path="after-surrogate.py")["tokens"]["prompt"] > 0
