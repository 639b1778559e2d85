"""`efim models`: pull a model by name through huggingface_hub's real download path (from a local
HTTP server that answers the hub's resolve URLs), check it, make it the default, complete with it."""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.helpers import efim_cli

REPO, FILE, COMMIT = "efim-test/tiny-GGUF", "tiny-q8_0.gguf", "0123456789abcdef0123456789abcdef01234567"


class Hub:
    """Serves ``/{repo}/resolve/{revision}/{file}`` (HEAD and GET, with Range) like the hub does:
    ETag, X-Repo-Commit, Content-Length. Counts GETs per path."""

    def __init__(self, files: dict[str, bytes]):
        self.files, self.gets, self.revisions = files, [], []
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
    assert "tiny-coder" in run(env, "models", "list").stdout.decode()

    # A config with other settings keeps them.
    cfg = tmp_path / "config" / "efim" / "config.toml"
    cfg.parent.mkdir(parents=True, exist_ok=True)
    cfg.write_text("max_tokens = 6\n\n[context]\nn_ctx_seq = 1024\nn_slots = 2\n")
    used = json.loads(run(env, "models", "use", "tiny-coder", "--json").stdout)
    assert used == {"model": out["path"], "config": str(cfg), "fim_template": None, "changes": []}
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
    r = run(env, "models", "pull", f"hf:{REPO}/missing.gguf", code=1)
    assert r.stderr.decode().startswith("efim: error: ") and "missing.gguf" in r.stderr.decode()
    r = run(env, "models", "pull", "no-such-model", code=2)
    assert b"unknown model 'no-such-model'" in r.stderr
    r = run(env, "models", "use", "tiny-coder", code=2)
    assert b"not downloaded; run: efim models pull tiny-coder" in r.stderr
    assert not (tmp_path / "config" / "efim" / "config.toml").exists()
