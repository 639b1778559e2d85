"""The remote backend's parts without a model: the ring, the slot map, the configuration, the
OpenAI-compatible driver against a tiny local fake server (no vLLM or SGLang here; the llama-server
driver is tested against real llama-server processes in tests/engine/test_remote.py), and what a
server sends, checked (issue 38): the event parser fuzzed, a hostile server's answers failing over."""

from __future__ import annotations

import json
import math
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from efim_local.backend import Pool, ReplicaError, Sampling
from efim_local.backend.drivers import Bounds, LlamaServer, OpenAI, Reader, restored
from efim_local.backend.pool import Ring, SlotMap
from efim_local.config import Config
from efim_local.errors import BackendError, ConfigError
from tests.helpers import HostileServer


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


def drain(call, timeout: float = 10.0):
    """Every event of ``call`` to its last (the test fails if that does not come within ``timeout``)."""
    events, deadline = [], time.monotonic() + timeout
    while not (call.finished and not call.events):
        assert time.monotonic() < deadline, f"no reply within {timeout} s: {events}"
        call.pool.wait_any(0.05)
        events += call.take()
    return events


def test_the_openai_driver_sends_token_ids_and_the_session():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), FakeOpenAI)
    threading.Thread(target=srv.serve_forever, args=(0.02,), daemon=True).start()
    try:
        url = f"http://127.0.0.1:{srv.server_port}"
        pool = Pool([url], "openai", api_key="k", model="m", n_vocab=100)
        events = drain(pool.start([1, 2, 3], Sampling(n_predict=3), "me/repo/a.py"))
        path, body, headers = FakeOpenAI.seen[-1]
        assert path == "/v1/completions" and body["prompt"] == [1, 2, 3] and body["model"] == "m"
        assert body["max_tokens"] == 3 and body["temperature"] == 0
        assert headers["x-session-id"] == "me/repo/a.py"
        assert "".join(d.text for k, d in events if k == "chunk") == "def f():"
        assert events[-1] == ("end", {"cached": 2, "evaluated": 1, "generated": 3, "stop": "length", "prompt_ms": None})
        bad = Pool([url], "openai", api_key="wrong", n_vocab=100)
        kind, err = drain(bad.start([1], Sampling(), "k"))[-1]
        assert kind == "error" and "http_401" in str(err)
    finally:
        srv.shutdown()


# -- what a server sends, checked (issue 38) -----------------------------------------------------
B = Bounds(n_vocab=100, n_prompt=10, n_predict=4)
EDGES = [-1, 0, 1, 4, 5, 10, 11, 99, 100, 1 << 40, -(1 << 40), 2.5, -0.5, 1e300, float("nan"), float("inf"),
         float("-inf"), True, False, None, "", "x", [], [1], {}, {"a": 1}]
JSON = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=4)),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
                    max_leaves=5)
ANY = st.sampled_from(EDGES) | JSON
# Real events (every value valid: ids in the vocabulary, counts within the bounds, finite times)...
LLAMA_EVENT = st.fixed_dictionaries({
    "content": st.text(max_size=3), "tokens": st.lists(st.integers(0, 99), max_size=1), "stop": st.booleans(),
    "stop_type": st.sampled_from(["eos", "limit", None]), "timings": st.fixed_dictionaries({
        "cache_n": st.integers(0, 10), "prompt_n": st.integers(0, 10), "predicted_n": st.integers(0, 4),
        "prompt_ms": st.floats(0, 1e5)})})
OPENAI_EVENT = st.fixed_dictionaries({
    "choices": st.lists(st.fixed_dictionaries({"text": st.text(max_size=3),
                                               "finish_reason": st.sampled_from(["length", "stop", None])}),
                        max_size=1),
    "usage": st.none() | st.fixed_dictionaries({
        "prompt_tokens": st.just(10), "completion_tokens": st.integers(0, 4),
        "prompt_tokens_details": st.fixed_dictionaries({"cached_tokens": st.integers(0, 10)})})})
# ... and the same with one value anywhere in them replaced by anything (None: as if missing).


def paths(obj, at=()):
    """Every place in a JSON value: each key of a dict, each item of a list, the value itself."""
    yield at
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for k, v in items:
        yield from paths(v, (*at, k))


def broken(events):
    def put(event, path, value):
        if not path:
            return value
        out = dict(event) if isinstance(event, dict) else list(event)
        out[path[0]] = put(out[path[0]], path[1:], value)
        return out

    return events.flatmap(lambda e: st.tuples(st.sampled_from(list(paths(e))), ANY).map(lambda pv: put(e, *pv)))


def sane(c, b: Bounds) -> None:
    """What the engine may use of a parsed chunk: typed and within the request's bounds."""
    assert isinstance(c.text, str) and isinstance(c.final, bool)
    assert all(type(t) is int and 0 <= t < b.n_vocab for t in c.ids)
    for n, hi in ((c.cached, b.n_prompt), (c.evaluated, b.n_prompt), (c.generated, b.most)):
        assert n is None or (type(n) is int and 0 <= n <= hi)
    assert c.prompt_ms is None or (type(c.prompt_ms) is float and math.isfinite(c.prompt_ms) and c.prompt_ms >= 0)
    assert c.stop is None or isinstance(c.stop, str)


@settings(max_examples=200)
@given(st.one_of(st.tuples(st.just(LlamaServer), st.lists(LLAMA_EVENT | broken(LLAMA_EVENT), min_size=1, max_size=3)),
                 st.tuples(st.just(OpenAI("m")), st.lists(OPENAI_EVENT | broken(OPENAI_EVENT), min_size=1, max_size=3))))
def test_the_event_parser_gives_sane_values_or_a_protocol_error(stream):
    """Whatever JSON a server sends, the parser gives typed values within the request's bounds, or
    fails the replica (``protocol``, one line): nothing else escapes."""
    driver, events = stream
    read = Reader(driver, B)
    for msg in events:
        try:
            c = read(msg)
        except ReplicaError as e:
            assert e.reason == "protocol" and "\n" not in str(e) and len(str(e)) < 300
            continue
        sane(c, B)
        assert read.n_ids <= B.most


@pytest.mark.parametrize("msg", [
    {"content": "x", "tokens": [-1]}, {"content": "x", "tokens": [-5]}, {"content": "x", "tokens": [100]},
    {"content": "x", "tokens": [True]}, {"content": "x", "tokens": [1.0]}, {"content": "x", "tokens": "12"},
    [1, 2, 3], "error", 7, None, {"content": 12345}, {"content": ["x"]},
    {"content": "", "stop": True, "timings": [1, 2]}, {"content": "", "stop": "yes"},
    {"stop": True, "timings": {"cache_n": -50}}, {"stop": True, "timings": {"prompt_n": 10 ** 12}},
    {"stop": True, "timings": {"predicted_n": 10 ** 15}}, {"stop": True, "timings": {"cache_n": 11}},
    {"stop": True, "timings": {"prompt_ms": float("nan")}}, {"stop": True, "timings": {"prompt_ms": float("inf")}},
    {"stop": True, "timings": {"prompt_ms": -1.0}}, {"stop": True, "timings": {"prompt_ms": "1"}},
    {"stop": True, "stop_type": ["eos"]}, {"content": "x", "tokens": [1, 2, 3, 4, 5]},
])
def test_a_bad_llama_server_event_fails_the_replica(msg):
    with pytest.raises(ReplicaError) as e:
        LlamaServer.parse(msg, B)
    assert e.value.reason == "protocol" and e.value.detail


def test_ids_count_over_the_whole_stream_and_good_events_parse():
    read = Reader(LlamaServer, B)
    assert read({"content": "ab", "tokens": [0, 99]}).ids == [0, 99]
    read({"content": "c", "tokens": [5, 6]})
    with pytest.raises(ReplicaError, match="5 tokens for 4 asked"):
        read({"content": "d", "tokens": [7]})
    openai = Reader(OpenAI("m"), B)  # no ids: each event with text is a token at least
    for _ in range(4):
        openai({"choices": [{"text": "x"}]})
    openai({"choices": [{"text": "", "finish_reason": "length"}]})
    with pytest.raises(ReplicaError, match="5 tokens for 4 asked"):
        openai({"choices": [{"text": "x"}]})
    with pytest.raises(ReplicaError, match="characters of text for 4 tokens"):
        Reader(LlamaServer, B)({"content": "x" * 5000, "tokens": [1]})
    end = LlamaServer.parse({"content": "", "stop": True, "stop_type": "eos", "timings": {
        "cache_n": 10, "prompt_n": 0, "predicted_n": 4, "prompt_ms": 2}}, B)
    assert (end.final, end.stop, end.cached, end.evaluated, end.generated, end.prompt_ms) == (
        True, "eos", 10, 0, 4, 2.0)
    # Warming asks for no token; llama-server generates one all the same.
    assert LlamaServer.parse({"stop": True, "timings": {"predicted_n": 1}}, Bounds(100, 10, 0)).generated == 1


@pytest.mark.parametrize("msg", [
    {"choices": {"text": "x"}}, {"choices": ["x"]}, {"choices": [{"text": 3}]},
    {"choices": [], "usage": {"prompt_tokens": 11}}, {"choices": [], "usage": {"prompt_tokens": 5,
                                                                                "prompt_tokens_details": {"cached_tokens": 6}}},
    {"choices": [], "usage": {"completion_tokens": -1}}, {"choices": [], "usage": [1]},
])
def test_a_bad_openai_event_fails_the_replica(msg):
    with pytest.raises(ReplicaError, match="bad reply"):
        OpenAI.parse(msg, B)


def test_props_and_slot_restores_are_checked():
    for out in ({"n_restored": -1}, {"n_restored": 1 << 40}, [1], {"n_restored": "3"}):
        with pytest.raises(ReplicaError):
            restored(out)
    assert restored({"n_restored": 7}) == 7 and restored({}) is None
    srv = HostileServer()
    try:
        for props in ([1, 2], {"total_slots": 10 ** 12}, {"total_slots": -3}, {"total_slots": "4"}):
            srv.props = props
            with pytest.raises(ReplicaError, match="bad reply"):
                LlamaServer.slots(Pool([srv.url], n_vocab=100).members[0].replica)
        srv.props = {}
        assert LlamaServer.slots(Pool([srv.url], n_vocab=100).members[0].replica) == 1
    finally:
        srv.close()


@pytest.fixture(scope="module")
def hostile():
    servers = HostileServer(n_vocab=100), HostileServer(n_vocab=100)
    yield servers
    for s in servers:
        s.close()


FAST = [m for m in HostileServer.MODES if m not in HostileServer.SLOW]


@pytest.mark.parametrize("mode", FAST)
def test_a_hostile_replica_fails_and_the_next_one_answers(hostile, mode):
    """Each bad answer fails its replica for that request (issue 38): alone, the call ends with a
    one-line error; with a good replica behind it, that one answers. The next call is served."""
    bad, good = hostile
    bad.mode = mode
    pool = Pool([bad.url], n_vocab=100, timeout=10)
    kind, err = drain(pool.start([1, 2, 3], Sampling(n_predict=2), "u/a.py"))[-1]
    assert kind == "error" and isinstance(err, BackendError) and "every backend failed" in str(err)
    assert "\n" not in str(err) and len(str(err)) < 400, str(err)
    assert {"error_event": "server_error", "truncated": "closed"}.get(mode, "protocol") in str(err), str(err)
    two = Pool([bad.url, good.url], n_vocab=100, timeout=10)
    key = next(k for k in (f"u/{i}.py" for i in range(100)) if two.order(k)[0].replica.url == bad.url)
    events = drain(two.start([1, 2, 3], Sampling(n_predict=2), key))
    kinds = [k for k, _ in events]
    assert kinds[-1] == "end" and "failover" in kinds, events
    # (the text a replica sent before it failed stays sent: endless sent two tokens' worth)
    assert "".join(d.text for k, d in events if k == "chunk") == "x" * (1 + (mode == "endless"))
    assert two.members[0].failed == 1
    assert events[-1][1]["generated"] == 1
    bad.mode = "ok"
    assert drain(pool.start([1, 2, 3], Sampling(n_predict=2), "u/a.py"))[-1][0] == "end"
