"""`efim serve --backend URL`: the daemon plans locally (vocabulary only) and a real llama-server
decodes; streaming and status go through the daemon's socket as with a local model."""

from __future__ import annotations

import os

import pytest

from efim_local.bench.peers import LlamaServer
from efim_local.bench.util import spawn_daemon
from efim_local.daemon.client import Client
from tests.helpers import llama_server_binary

KEY = "e2e-key-9876543210"


def test_the_daemon_answers_through_a_remote_llama_server(tiny_model, monkeypatch):
    binary = llama_server_binary()
    if isinstance(binary, str):
        pytest.skip(binary)
    server = LlamaServer(binary, tiny_model, 1024, threads=1, parallel=2, extra=("--api-key", KEY))
    monkeypatch.setenv("EFIM_API_KEY", KEY)
    proc, sock = spawn_daemon(tiny_model, None, "--backend", server.url, "--n-ctx", "1024")
    try:
        client = Client(sock, timeout=60)
        src = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return \n"
        parts: list[str] = []
        # (no healing: a healed token is a call of its own to the server, test_remote_heal_budget.py)
        res = client.call("complete", {"path": "/r/a.py", "text": src, "offset": len(src) - 1, "stream": True,
                                       "max_tokens": 16, "heal": False}, on_notification=lambda m: parts.append(m["params"]["text"]))
        assert res["text"] == "".join(parts)
        assert res["remote"]["url"] == server.url and res["remote"]["failover"] == []
        # The same request again is the answer cache's; a shorter one goes out and the server reuses its cache.
        again = client.call("complete", {"path": "/r/a.py", "text": src, "offset": len(src) - 1, "max_tokens": 16,
                                         "heal": False})
        assert again["text"] == res["text"] and again["source"] == "cache"
        short = client.call("complete", {"path": "/r/a.py", "text": src, "offset": len(src) - 1, "max_tokens": 8,
                                         "heal": False})
        assert res["text"].startswith(short["text"]) and short["tokens"]["cached"] > 0
        assert short["remote"]["miss"] is None
        status = client.call("status")
        assert status["vocab_only"] is True and status["backend"]["replicas"][0]["served"] == 2
        assert KEY not in str(status)
        client.call("shutdown")
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
        server.close()
    assert os.environ["EFIM_API_KEY"] == KEY
