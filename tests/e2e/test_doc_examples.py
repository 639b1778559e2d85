"""The examples in README.md and docs/*.md, replayed against the real CLI and daemon.

- ```console blocks: each ``$ efim ...`` line is run, in document order, in one fresh
  home (as a reader following the docs would), on the bundled default model. JSON output
  must have the same keys (recursively), the same types, and the same values except where
  they depend on time or the machine; text output must have the same lines once absolute
  paths are cut to their last part and pids, uptimes and thread counts are masked. A line
  ``...`` stands for any number of lines.
- ```json blocks with ``→`` (sent) and ``←`` (received) lines: sent to a real daemon over its
  socket, replies compared the same way; ``...`` in an object means "and other keys".
"""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
EFIM = [sys.executable, "-m", "efim_local.cli"]
ELLIPSIS = "\N{HORIZONTAL ELLIPSIS}"  # stands for "and other keys" in a JSON object

# Values under these keys depend on time or the machine: only their keys and types are compared.
VOLATILE = {"timings", "pid", "uptime_s", "threads", "threads_batch", "cores", "cores_free", "cores_used_by_others",
            "prefill_tok_s", "idle_tasks"}  # machine or timing
# In the daemon, which slot serves a request, the slots' contents and tier usage also depend on
# when idle work (prefill, calibration, saving) ran.
VOLATILE_DAEMON = VOLATILE | {"slot", "slots", "store", "requests", "python_threads", "engine_time_s"}


# -- parsing the docs ------------------------------------------------------------------------
def fenced_blocks(path: Path, lang: str) -> list[tuple[int, list[str]]]:
    """(first line number, lines) of each ```lang block."""
    blocks, cur, start = [], None, 0
    for n, line in enumerate(path.read_text("utf-8").splitlines(), 1):
        if cur is None and line.strip() == f"```{lang}":
            cur, start = [], n + 1
        elif cur is not None and line.strip() == "```":
            blocks.append((start, cur))
            cur = None
        elif cur is not None:
            cur.append(line)
    return blocks


def console_examples(path: Path) -> list[tuple[str, str, list[str]]]:
    """(where, command, expected output lines) for each ``$`` line of the console blocks."""
    out = []
    for start, lines in fenced_blocks(path, "console"):
        cur = None
        for i, line in enumerate(lines):
            if line.startswith("$ "):
                cur = (f"{path.name}:{start + i}", line[2:], [])
                out.append(cur)
            elif cur is not None:
                cur[2].append(line)
    return out


def wire_examples(path: Path) -> list[tuple[str, list[tuple[str, str]]]]:
    """(where, [(direction, message text)]) for each json block written as → and ← lines."""
    out = []
    for start, lines in fenced_blocks(path, "json"):
        msgs: list[tuple[str, str]] = []
        for line in lines:
            s = line.strip()
            if s[:1] in ("→", "←"):
                msgs.append((s[0], s[1:].strip()))
            elif s and msgs:
                msgs[-1] = (msgs[-1][0], msgs[-1][1] + " " + s)
        if msgs:
            out.append((f"{path.name}:{start}", msgs))
    return out


def doc_json(text: str):
    """A JSON example, where ``...`` in an object stands for other keys."""
    return json.loads(re.sub(r",\s*\.\.\.\s*}", f', "{ELLIPSIS}": true}}', text))


# -- comparing -------------------------------------------------------------------------------
def kind(v) -> str:
    if v is None or isinstance(v, (bool, str, list, dict)):
        return type(v).__name__
    return "number"


def same_value(doc, real) -> bool:
    if isinstance(doc, str) and isinstance(real, str) and doc.startswith("/") and real.startswith("/"):
        return Path(doc).name == Path(real).name  # machine-specific directories
    if isinstance(doc, float) and isinstance(real, float) and "." in repr(doc):
        return round(real, len(repr(doc).split(".")[1])) == doc  # the doc may round
    return doc == real


def json_diff(doc, real, volatile: set, where: str = "$", loose: bool = False) -> list[str]:
    """Differences between a documented JSON value and the real one (empty: they agree)."""
    if kind(doc) != kind(real) and not (loose and None in (doc, real)):  # a volatile value may be unset
        return [f"{where}: the doc shows {kind(doc)} {doc!r}, the code gives {kind(real)} {real!r}"]
    if isinstance(doc, dict):
        shown = set(doc) - {ELLIPSIS}
        diffs = [f"{where}: the doc shows {k!r}, the code has no such key" for k in sorted(shown - set(real))]
        if ELLIPSIS not in doc:
            diffs += [f"{where}: the code gives {k!r}, the doc does not show it" for k in sorted(set(real) - shown)]
        for k in sorted(shown & set(real)):
            diffs += json_diff(doc[k], real[k], volatile, f"{where}.{k}", loose or k in volatile)
        return diffs
    if isinstance(doc, list):
        if len(doc) != len(real):
            return [f"{where}: the doc shows {len(doc)} items, the code gives {len(real)}"]
        return [d for i, (a, b) in enumerate(zip(doc, real)) for d in json_diff(a, b, volatile, f"{where}[{i}]", loose)]
    if not loose and not same_value(doc, real):
        return [f"{where}: the doc shows {doc!r}, the code gives {real!r}"]
    return []


def shape(line: str) -> str:
    """A text output line without what depends on the machine or the moment."""
    line = re.sub(r"(?<![\w.~])/[^\s,()]*/([^\s,()/]+)", r"\1", line)  # absolute paths: last part
    line = re.sub(r"\bpid \d+", "pid N", line)
    line = re.sub(r"\bup [\d.]+ s\b", "up N s", line)
    line = re.sub(r"\b\d+\+\d+ threads\b", "N+N threads", line)
    line = re.sub(r"\b\d+ cores free\b", "N cores free", line)
    line = re.sub(r"\bprefill (\d+ tok/s|speed not learned yet)", "prefill N tok/s", line)  # the learned speed
    line = re.sub(r"\buse [\d.]+ of \d+ cores\b", "use N of N cores", line)  # other processes' CPU
    line = re.sub(r"\b\d+(\.\d+)? ms\b", "N ms", line)  # latencies (daemon status)
    line = re.sub(r"^engine time\s.*", "engine time N", line)  # where the engine's time went (the moment's)
    line = re.sub(r"^idle work\s.*", "idle work N", line)  # what idle time does (the moment's)
    # A used slot's tokens: the prompt and the answer's continuation, which idle work extends while
    # the answer is shown (type-through, accept), so how far depends on the moment.
    line = re.sub(r"^(slot \d+\s+)[1-9]\d* tokens", r"\1N tokens", line)
    # and what runs in it as status asks (the continuation, growth: the moment's too)
    line = re.sub(r"^(slot \d+\s+\S+ tokens\s+)[a-z]+ \((prefill|generate)\)", r"\1idle", line)
    return " ".join(line.split())


def lines_match(doc: list[str], real: list[str]) -> bool:
    """Line by line, where a doc line ``...`` matches any number of real lines."""
    if not doc:
        return not real
    if doc[0].strip() == "...":
        return any(lines_match(doc[1:], real[i:]) for i in range(len(real) + 1))
    return bool(real) and shape(doc[0]) == shape(real[0]) and lines_match(doc[1:], real[1:])


# -- the environment -------------------------------------------------------------------------
def fresh_env(home: Path) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("EFIM_", "XDG_")) and k != "LLAMA_CPP_LIB_PATH"}
    env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / "config"), XDG_CACHE_HOME=str(home / "cache"),
               XDG_STATE_HOME=str(home / "state"), XDG_RUNTIME_DIR=str(home / "run"))
    # The latency budget is learned from this machine's speed now: on a loaded test machine it cuts
    # the plans the docs show (as for the other test daemons, tests/helpers.py). It has its own tests.
    (home / "config" / "efim").mkdir(parents=True, exist_ok=True)
    (home / "config" / "efim" / "config.toml").write_text("max_prompt_ms = 0\n")
    return env


def test_docs_have_examples():
    """The parsers find what they should (an empty replay would pass vacuously)."""
    assert len([e for p in DOCS for e in console_examples(p)]) >= 8
    assert len([e for p in DOCS for e in wire_examples(p)]) >= 5


def test_console_examples(tmp_path):
    env = fresh_env(tmp_path / "home")
    failures = []
    try:
        for path in DOCS:
            for where, command, expected in console_examples(path):
                argv = shlex.split(command, comments=True)
                assert argv[0] == "efim", f"{where}: only efim commands can be replayed: {command}"
                r = subprocess.run(EFIM + argv[1:], env=env, cwd=ROOT, capture_output=True, text=True, timeout=180)
                real = (r.stdout + r.stderr).splitlines()
                shown_error = bool(expected) and expected[0].startswith("efim: error:")
                if (r.returncode != 0) != shown_error:
                    failures.append(f"{where}: `{command}` exited {r.returncode}: {r.stderr.strip()}")
                    continue
                if expected and expected[0].lstrip().startswith(("{", "[")):
                    try:
                        diffs = json_diff(doc_json("\n".join(expected)), json.loads(r.stdout), VOLATILE)
                    except ValueError as e:
                        diffs = [f"not JSON: {e}: {r.stdout!r}"]
                    failures += [f"{where}: `{command}`: {d}" for d in diffs]
                elif not lines_match(expected, real):
                    failures.append(f"{where}: `{command}`:\n  the doc shows:\n    " + "\n    ".join(expected)
                                    + "\n  the code prints:\n    " + "\n    ".join(real))
    finally:
        subprocess.run(EFIM + ["daemon", "stop"], env=env, cwd=ROOT, capture_output=True, timeout=120)
    assert not failures, "the docs' console examples drifted from the code:\n" + "\n".join(failures)


# -- the daemon's wire -------------------------------------------------------------------------
class Daemon:
    """``efim serve`` on a socket of its own; restarted after a documented ``shutdown``."""

    def __init__(self, home: Path):
        self.env = fresh_env(home)
        self.sock_path = home / "efim.sock"
        self.proc = None

    def connect(self) -> socket.socket:
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(120)
        s.connect(str(self.sock_path))
        return s

    def start(self) -> None:
        from efim_local.daemon.client import running

        self.proc = subprocess.Popen(EFIM + ["serve", "--socket", str(self.sock_path)], env=self.env, cwd=ROOT,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while not running(self.sock_path):
            assert self.proc.poll() is None and time.monotonic() < deadline, "efim serve did not start"
            time.sleep(0.1)

    def wait_stopped(self) -> None:
        self.proc.wait(timeout=60)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=60)


def read_frames(sock: socket.socket, reply_ids: set) -> list[dict]:
    """Frames until every id in ``reply_ids`` got its reply."""
    frames, buf, pending = [], b"", set(reply_ids)
    while pending:
        while b"\n" not in buf:
            chunk = sock.recv(1 << 16)
            assert chunk, "the daemon closed the connection"
            buf += chunk
        line, buf = buf.split(b"\n", 1)
        frames.append(json.loads(line))
        if "method" not in frames[-1]:
            pending.discard(frames[-1].get("id"))
    return frames


def check_exchange(where: str, msgs: list[tuple[str, str]], sock: socket.socket) -> tuple[list[str], bool]:
    """Send a block's → messages, compare the ← ones; returns (differences, saw a shutdown)."""
    expected, sent_ids = [], {None}  # None: the reply to a request whose id could not be read
    for direction, text in msgs:
        if direction == "→":
            try:
                sent = json.loads(text)
                frame = json.dumps(sent, ensure_ascii=False, separators=(",", ":"))
                sent_ids.add(sent.get("id"))
            except ValueError:  # a malformed request, on purpose
                frame = text
            sock.sendall(frame.encode() + b"\n")
        else:
            expected.append(doc_json(text))
    replies = [m for m in expected if "method" not in m]
    unsent = [m.get("id") for m in replies if m.get("id") not in sent_ids]
    if unsent:
        return [f"{where}: replies to ids {unsent} that the block does not send"], False
    real = read_frames(sock, {m.get("id") for m in replies})
    diffs = []
    by_id = {f.get("id"): f for f in real if "method" not in f}
    for m in replies:
        diffs += json_diff(m, by_id.get(m.get("id")), VOLATILE_DAEMON, f"reply {m.get('id')!r}")
    for method in {m["method"] for m in expected if "method" in m}:
        doc_n = [m for m in expected if m.get("method") == method]
        real_n = [f for f in real if f.get("method") == method]
        if not real_n:
            diffs.append(f"no {method!r} notification")
        for f in real_n:  # the doc shows some of them; each real one has their shape
            diffs += json_diff(doc_n[0], f, VOLATILE_DAEMON | {"text"}, method)
        joined = lambda ms: "".join(m["params"].get("text", "") for m in ms)
        if joined(doc_n) != joined(real_n):
            diffs.append(f"{method}: the doc's pieces make {joined(doc_n)!r}, the code's {joined(real_n)!r}")
        last = max(i for i, f in enumerate(real) if f.get("method") == method)
        rid = real[last]["params"].get("id")
        if rid in by_id and real.index(by_id[rid]) < last:
            diffs.append(f"{method}: a notification came after the reply to {rid!r}")
    stopping = any(isinstance(f.get("result"), dict) and f["result"].get("stopping") for f in real)
    return [f"{where}: {d}" for d in diffs], stopping


def test_wire_examples(tmp_path):
    daemon = Daemon(tmp_path)
    failures = []
    try:
        for path in DOCS:
            for where, msgs in wire_examples(path):
                with daemon.connect() as sock:
                    diffs, stopping = check_exchange(where, msgs, sock)
                failures += diffs
                if stopping:
                    daemon.wait_stopped()
    finally:
        daemon.close()
    assert not failures, "the docs' protocol examples drifted from the daemon:\n" + "\n".join(failures)


@pytest.mark.parametrize("doc,real,ok", [
    ({"a": 1, "t": {"x": 1.5}}, {"a": 1, "t": {"x": 9.25}}, True),
    ({"a": 1}, {"a": 1, "b": None}, False),
    ({"a": 1, ELLIPSIS: True}, {"a": 1, "b": None}, True),
    ({"a": 1.5}, {"a": 1.49}, True),
    ({"a": 1.5}, {"a": 1.6}, False),
    ({"a": None}, {"a": {}}, False),
    ({"p": "/home/me/x.py"}, {"p": "/tmp/y/x.py"}, True),
    ({"t": {"p": None}}, {"t": {"p": "/x.py"}}, True),
])
def test_json_diff(doc, real, ok):
    assert (not json_diff(doc, real, {"t"})) == ok


def test_shape():
    assert lines_match(["running      pid 8354 on /run/user/1000/efim/efim.sock, up 12.4 s", "..."],
                       ["running  pid 1 on /tmp/x/efim/efim.sock, up 0.3 s", "model x", "slot 0"])
    assert not lines_match(["hits slot=1"], ["hits slot=0"])
    assert lines_match(["speed prefill 15464 tok/s, other processes use 0.0 of 2 cores"],
                       ["speed prefill speed not learned yet, other processes use 1.96 of 4 cores"])
    assert lines_match(["requests 1 served, latency p50 4.8 ms / p95 4.8 ms (last 1)"],
                       ["requests 1 served, latency p50 1477.3 ms / p95 12 ms (last 1)"])
