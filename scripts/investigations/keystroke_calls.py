"""How many distinct efim functions one keystroke on a warm slot passes through, from the socket to
llama_decode and back, and how deep generators nest on the way (issue 40's acceptance measures).

A daemon (the server and its engine) runs in this process on the bundled model; a client opens a
file, asks for a completion at its end, waits until the daemon's idle work is done, then types one
character the last answer did not start with (so the answer is computed, not typed through) and
asks again. Only that last edit and request are traced: every Python call into efim_local on every
thread (``threading.setprofile``, set before the daemon's threads start), the functions before the
first ``llama_decode`` (``Context.decode``), and at each decode the number of generator frames
on the engine thread's stack; then, for 5 s of the idle work that follows, that nesting only. Last,
unprofiled, 30 such keystrokes: the milliseconds each costs outside ``llama_decode`` (Python: the
client's round trips for the edit and the request, less the decodes' time).

    PYTHONPATH=. .venv/bin/python scripts/investigations/keystroke_calls.py [-v] [-a] [-t] [--request]

``-v``: every function, by thread; ``-a``: the daemon's side from the request's bytes to the reply's
send (its threads, not the client's), by file; ``-t``: each timed keystroke.

``--request``: trace the request alone, 1 s after its edit (the edit's own work, and the answer the
daemon begins at the keystroke, done by then): the way issue 40's review seems to have counted.
"""

import inspect
import json
import os
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

tmp = Path(tempfile.mkdtemp(prefix="efim-calls-"))
for k in ("XDG_RUNTIME_DIR", "XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME"):
    os.environ[k] = str(tmp / k.lower())
    Path(os.environ[k]).mkdir(mode=0o700)

import efim_local  # noqa: E402
from efim_local.api import open_engine  # noqa: E402
from efim_local.cli import build_config  # noqa: E402
from efim_local.daemon.client import Client  # noqa: E402
from efim_local.daemon.server import Server  # noqa: E402

ROOT = str(Path(efim_local.__file__).parent)
recording = False
unhook = False  # set before the timing: every thread then drops the profile hook at its next call
idle = False  # after the answer: only the nesting at each decode of the idle work that follows
idle_nesting: list[int] = []
first_seen: dict = {}  # (file, function) -> order of its first call on the daemon's threads (not the client's)
asking = False  # the completion request is sent (its reply is the next the daemon sends)
replied_at: int | None = None  # that order at the completion's reply (what follows it is after the answer)
REPEAT = 30
calls: dict[str, set] = defaultdict(set)  # thread name -> {(file, function)}
before_decode: set = set()
decoded = False
nesting: list[int] = []


def generators(frame) -> int:
    depth = 0
    while frame is not None:
        depth += bool(frame.f_code.co_flags & inspect.CO_GENERATOR)
        frame = frame.f_back
    return depth


def profile(frame, event, arg):
    global decoded, replied_at
    if unhook:  # (each thread takes its own hook off: threading.setprofile(None) only reaches new ones)
        sys.setprofile(None)
        return
    if not (recording or idle) or event != "call" or not frame.f_code.co_filename.startswith(ROOT):
        return
    code = frame.f_code
    key = (os.path.relpath(code.co_filename, ROOT), code.co_qualname)
    if idle:
        if key == ("llama/context.py", "Context.decode"):
            idle_nesting.append(generators(frame.f_back))
        return
    name = threading.current_thread().name
    calls[name].add(key)
    if name != "MainThread":
        first_seen.setdefault(key, len(first_seen))
        if key == ("daemon/framing.py", "Connection.send") and asking and replied_at is None:
            replied_at = first_seen[key]
    if key == ("llama/context.py", "Context.decode"):
        decoded = True
        nesting.append(generators(frame.f_back))
    elif not decoded:
        before_decode.add(key)


threading.setprofile(profile)
sys.setprofile(profile)

text = Path(efim_local.__file__).with_name("config.py").read_text()[:6000]
text = text[:text.rfind("\n", 0, len(text) - 200) + 1]
server = Server(tmp / "efim.sock", watch=False)
server.bind()
engine = open_engine(build_config())
server.attach(engine)
threading.Thread(target=server.serve_forever, name="accept", daemon=True).start()

with Client(tmp / "efim.sock", timeout=120) as c:
    path = str(tmp / "doc.py")
    c.call("didOpen", {"path": path, "text": text, "version": 1})
    end = {"line": text.count("\n"), "character": 0}
    first = c.call("complete", {"path": path, "position": end, "max_tokens": 16})
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        st = c.call("status")
        if not st.get("idle_tasks") and not st.get("queued"):
            break
        time.sleep(0.5)
    ch = "q" if not first.get("text", "").startswith("q") else "z"
    recording = "--request" not in sys.argv
    edit = {"range": {"start": end, "end": end}, "text": ch}
    c.call("didChange", {"path": path, "version": 2, "contentChanges": [edit]})
    if not recording:
        time.sleep(1.0)
        recording = True
    asking = True
    out = c.call("complete", {"path": path, "position": {"line": end["line"], "character": 1}, "max_tokens": 16})
    recording, idle = False, True
    time.sleep(5.0)  # the idle work after the answer (its continuation, growth)
    idle = False

    # Unprofiled: what the same keystroke costs outside llama_decode (wall time of the edit and the
    # request as the client sees them, less the decodes run meanwhile), over REPEAT keystrokes.
    unhook = True
    threading.setprofile(None)
    sys.setprofile(None)
    from efim_local.llama.context import Context
    plain_decode, in_decode = Context.decode, [0.0]

    def timed_decode(self, *a, **k):
        t = time.perf_counter()
        try:
            return plain_decode(self, *a, **k)
        finally:
            in_decode[0] += time.perf_counter() - t

    Context.decode = timed_decode
    overhead, line, col = [], end["line"], 1
    for i in range(REPEAT):
        while True:
            st = c.call("status")
            if not st.get("idle_tasks") and not st.get("queued"):
                break
            time.sleep(0.2)
        ch = "qz"[i % 2]
        in_decode[0], t = 0.0, time.perf_counter()
        edit = {"range": {"start": {"line": line, "character": col}, "end": {"line": line, "character": col}},
                "text": ch}
        c.call("didChange", {"path": path, "version": 3 + i, "contentChanges": [edit]})
        col += 1
        t1 = time.perf_counter()
        r = c.call("complete", {"path": path, "position": {"line": line, "character": col}, "max_tokens": 16})
        t2 = time.perf_counter()
        overhead.append((t2 - t - in_decode[0]) * 1e3)
        if "-t" in sys.argv:
            print(f"edit {1e3*(t1-t):.2f} complete {1e3*(t2-t1):.2f} decode {1e3*in_decode[0]:.2f} "
                  f"{r.get('source')} {r.get('timings')} {r.get('tokens')}")
        time.sleep(0.05)

server.stop()
engine_thread = next((n for n in calls if "engine" in n.lower()), None)
everything = set().union(*calls.values())
# The daemon's side: its threads (not the client's, MainThread), from the request's bytes to the
# reply's send; a comprehension, generator expression or lambda is a code object of its own.
served = {k for k, i in first_seen.items() if replied_at is None or i <= replied_at}
inline = {k for k in served if k[1].rsplit(".", 1)[-1] in ("<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>",
                                                          "<lambda>")}
report = {
    "answer": {k: out.get(k) for k in ("source", "cache_tier", "tokens")},
    "distinct_functions": len(everything), "files": len({f for f, _ in everything}),
    "per_thread": {n: len(s) for n, s in calls.items()},
    "daemon_socket_to_reply": len(served), "of_them_comprehensions_and_lambdas": len(inline),
    "daemon_files_socket_to_reply": len({f for f, _ in served}),
    "daemon_after_reply": len(first_seen) - len(served),
    "engine_thread": engine_thread,
    "before_first_decode": len(before_decode), "files_before_first_decode": len({f for f, _ in before_decode}),
    "decodes": len(nesting), "max_generator_nesting": max(nesting, default=0),
    "idle_decodes_5s": len(idle_nesting), "max_generator_nesting_idle": max(idle_nesting, default=0),
    "python_ms_per_keystroke_median": round(sorted(overhead)[len(overhead) // 2], 2),
    "python_ms_per_keystroke_min": round(min(overhead), 2),
}
print(json.dumps(report, indent=1))
if "-a" in sys.argv:  # the daemon's side to the reply, by file (what each area of the product adds)
    by_file = defaultdict(list)
    for f, q in served:
        by_file[f].append(q)
    for f in sorted(by_file, key=lambda f: (-len(by_file[f]), f)):
        print(f"{len(by_file[f]):3d}  {f}: {', '.join(sorted(by_file[f]))}")
if "-v" in sys.argv:
    for n, s in calls.items():
        print(f"\n{n}:")
        for f, q in sorted(s):
            print(f"  {f}: {q}")
