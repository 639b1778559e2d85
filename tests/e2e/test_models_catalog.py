"""`efim models` for a first hour without a hub: templates that belong to a model, a hub that cannot
be reached, downloads checked against the catalog, near-miss names, and catalog files that try to
hang or escape (issue 27: items 3, 4, 5, 11)."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time

import pytest

from tests.e2e.test_models import FILE, REPO, Hub, run
from tests.helpers import efim_cli


@pytest.fixture
def hub(tiny_model, tiny_model_nofim):
    h = Hub({f"{REPO}/{FILE}": tiny_model.read_bytes(), f"{REPO}/nofim.gguf": tiny_model_nofim.read_bytes()})
    yield h
    h.close()


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
