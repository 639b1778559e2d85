"""The remote backend's parts without a model: the ring, the slot map, the configuration, and the
OpenAI-compatible driver against a tiny local fake server (no vLLM or SGLang here; the llama-server
driver is tested against real llama-server processes in tests/engine/test_remote.py)."""

from __future__ import annotations

import json
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from efim_local.backend import Pool, Sampling
from efim_local.backend.pool import Ring, SlotMap
from efim_local.config import Config
from efim_local.errors import ConfigError


def test_the_ring_keeps_a_key_on_its_replica_and_spreads_keys():
    urls = [f"http://r{i}:8080" for i in range(3)]
    ring = Ring(urls)
    keys = [f"u/repo/f{i}.py" for i in range(3000)]
    first = [ring.order(k)[0] for k in keys]
    assert first == [ring.order(k)[0] for k in keys]  # stable
    assert min(Counter(first).values()) > 700  # spread
    assert all(sorted(ring.order(k)) == [0, 1, 2] for k in keys[:50])  # every replica, in turn
    # Losing replica 2 moves only its own keys.
    two = Ring(urls[:2])
    assert all(two.order(k)[0] == f for k, f in zip(keys, first) if f != 2)


def test_the_slot_map_pins_a_file_and_expects_its_common_prefix():
    m = SlotMap(2)
    a, b = m.slot_for("a"), m.slot_for("b")
    assert a != b and m.slot_for("a") == a
    m.held[a] = np.arange(10, dtype=np.int32)
    assert m.expected(a, np.arange(20, dtype=np.int32)) == 10
    assert m.expected(a, np.arange(10, dtype=np.int32)) == 9  # the last token is computed again
    assert m.slot_for("c") == b  # the least recently used goes


def test_the_slot_map_says_whose_slot_it_was_and_whether_it_is_new():
    m = SlotMap(1)
    assert m.pin("a")[1:] == (None, True)
    m.held[0] = np.arange(5, dtype=np.int32)
    assert m.pin("a")[1:] == (None, False)
    slot, (key, held), fresh = m.pin("b")
    assert (slot, key, held.tolist(), fresh) == (0, "a", [0, 1, 2, 3, 4], True)


def test_backend_config_is_checked_and_the_key_never_prints():
    c = Config(backend="http://a:1, https://b/x", api_key="s3cret")
    assert c.backend == ("http://a:1", "https://b/x")
    assert "s3cret" not in repr(c) and "s3cret" not in f"{c.api_key}" and "s3cret" not in str(c.api_key)
    assert json.loads(json.dumps(c.to_json()))["api_key"] == "s3cret"  # it still reaches the daemon
    for bad in ("ftp://a", "http://", "http://user:pw@a", "http://a:99999", 3):
        with pytest.raises(ConfigError):
            Config(backend=[bad])
    with pytest.raises(ConfigError):
        Config(backend_api="grpc")


class FakeOpenAI(BaseHTTPRequestHandler):
    """/v1/completions streaming, as vLLM answers: text chunks, then usage with cached tokens."""

    seen: list = []

    def do_POST(self):  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        FakeOpenAI.seen.append((self.path, body, dict(self.headers)))
        if self.headers.get("Authorization") != "Bearer k":
            self.send_response(401)
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for t in ("def", " f", "():"):
            self.wfile.write(b"data: " + json.dumps({"choices": [{"text": t, "finish_reason": None}]}).encode()
                             + b"\n\n")
        last = {"choices": [{"text": "", "finish_reason": "length"}]}
        usage = {"choices": [], "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": 3,
                                          "prompt_tokens_details": {"cached_tokens": 2}}}
        for m in (last, usage):
            self.wfile.write(b"data: " + json.dumps(m).encode() + b"\n\n")
        self.wfile.write(b"data: [DONE]\n\n")

    def log_message(self, *a):
        pass


def drain(call):
    events = []
    while not (call.finished and not call.events):
        call.pool.wait_any(0.05)
        events += call.take()
    return events


def test_the_openai_driver_sends_token_ids_and_the_session():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), FakeOpenAI)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{srv.server_port}"
        pool = Pool([url], "openai", api_key="k", model="m")
        events = drain(pool.start([1, 2, 3], Sampling(n_predict=3), "me/repo/a.py"))
        path, body, headers = FakeOpenAI.seen[-1]
        assert path == "/v1/completions" and body["prompt"] == [1, 2, 3] and body["model"] == "m"
        assert body["max_tokens"] == 3 and body["temperature"] == 0
        assert headers["x-session-id"] == "me/repo/a.py"
        assert "".join(d.text for k, d in events if k == "chunk") == "def f():"
        assert events[-1] == ("end", {"cached": 2, "evaluated": 1, "generated": 3, "stop": "length", "prompt_ms": None})
        bad = Pool([url], "openai", api_key="wrong")
        kind, err = drain(bad.start([1], Sampling(), "k"))[-1]
        assert kind == "error" and "http_401" in str(err)
    finally:
        srv.shutdown()
