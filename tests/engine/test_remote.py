"""The remote backend against real llama-server processes (two replicas of the tiny model on loopback
ports, with an API key): exactness, file affinity, failover, auth.

llama-server is built from the same llama.cpp the Python package runs (native/cached_server.sh),
so at temperature 0 a remote answer equals the in-process answer for the same plan.
"""

from __future__ import annotations

import json
import logging
import threading

import pytest

from efim_local.bench.peers import LlamaServer
from efim_local.engine import CompletionRequest, Engine
from efim_local.engine.remote import RemoteEngine
from efim_local.errors import BackendError
from tests.helpers import llama_server_binary, small_config

KEY = "test-key-0123456789"
N_CTX = 1024
SRC = "".join(f"def f{i}(x):\n    y = x * {i}\n    return y + {i}\n\n" for i in range(12))


@pytest.fixture(scope="module")
def binary():
    b = llama_server_binary()
    if isinstance(b, str):
        pytest.skip(b)
    return b


def start(binary, model, n=2):
    return [LlamaServer(binary, model, N_CTX, threads=1, parallel=2, extra=("--api-key", KEY)) for _ in range(n)]


@pytest.fixture(scope="module")
def replicas(binary, tiny_model):
    servers = start(binary, tiny_model)
    yield servers
    for s in servers:
        s.close()


def remote_config(servers, **kw):
    return small_config(backend=[s.url for s in servers], api_key=KEY, max_tokens=24, **kw)


def requests(n_files=4, steps=3):
    """Type-through in several files: each file's cursor moves on through a word."""
    out = []
    for f in range(n_files):
        cur = SRC.index(f"return y + {f}") + 7
        for k in range(steps):
            text = SRC[:cur] + "yz"[:k] + SRC[cur:]
            out.append(CompletionRequest(text, cur + k, path=f"/repo/file{f}.py"))
    return out


def test_a_remote_answer_equals_the_in_process_answer(replicas, tiny_model):
    reqs = requests()
    with Engine(small_config(max_tokens=24), tiny_model) as local:
        want = [(c.text, c.stop_reason) for c in map(local.complete, reqs)]
    with RemoteEngine(remote_config(replicas), tiny_model) as remote:
        got = [remote.complete(r) for r in reqs]
    assert [(c.text, c.stop_reason) for c in got] == want
    assert any(c.text for c in got)
    # Type-through: the later keystrokes of a file are served from the replica's cache, as expected.
    later = [c for i, c in enumerate(got) if i % 3]
    assert all(c.tokens.cached > 0 and c.remote["miss"] is None for c in later), [c.remote for c in later]
    assert all(c.cache_tier == "remote" for c in later)


def test_one_file_one_replica_and_files_spread(replicas, tiny_model):
    with RemoteEngine(remote_config(replicas), tiny_model) as remote:
        seen: dict[str, set] = {}
        for r in requests(n_files=10, steps=2):
            c = remote.complete(r)
            seen.setdefault(r.path, set()).add((c.remote["url"], c.remote["slot"]))
    assert all(len(v) == 1 for v in seen.values()), seen
    assert {next(iter(v))[0] for v in seen.values()} == {s.url for s in replicas}


def test_a_replica_killed_mid_run_loses_nothing(binary, tiny_model):
    servers = start(binary, tiny_model)
    try:
        reqs = requests(n_files=6, steps=2)
        long = CompletionRequest(SRC, len(SRC) // 2, path="/repo/long.py", max_tokens=200, ignore_eog=True)
        with Engine(small_config(max_tokens=24), tiny_model) as local:
            want = [local.complete(r).text for r in reqs]
            want_long = local.complete(long).text
        with RemoteEngine(remote_config(servers), tiny_model) as remote:
            got = [remote.complete(r) for r in reqs[:4]]
            # Kill the replica serving the long answer once its first text is out: the other one
            # takes over and the editor gets the rest, nothing twice.
            shown: list[str] = []
            killed = threading.Event()

            def on_text(t):
                shown.append(t)
                if not killed.is_set():
                    killed.set()
                    url = remote.backend.pool.order(key_of(long.path))[0].replica.url
                    next(s for s in servers if s.url == url).kill()

            out_long = remote.complete(long, on_text=on_text)
            got += [remote.complete(r) for r in reqs[4:]]
        assert killed.is_set()
        assert out_long.text == want_long and "".join(shown) == want_long
        assert out_long.remote["failover"], out_long.remote
        assert [c.text for c in got] == want
        assert sum(s.proc.poll() is None for s in servers) == 1
    finally:
        for s in servers:
            s.close()


def key_of(path):
    from efim_local.engine.remote_steps import session_key

    return session_key(path)


def test_auth_a_wrong_key_fails_and_the_key_is_never_shown(replicas, tiny_model, monkeypatch, caplog):
    req = requests(n_files=1, steps=1)[0]
    cfg = remote_config(replicas)
    with RemoteEngine(cfg.with_overrides(api_key="wrong"), tiny_model) as bad:
        with pytest.raises(BackendError, match="http_401"):
            bad.complete(req)
    monkeypatch.setenv("EFIM_API_KEY", KEY)  # the environment's key wins over the config's
    caplog.set_level(logging.DEBUG)
    with RemoteEngine(cfg.with_overrides(api_key="wrong"), tiny_model) as good:
        c = good.complete(req)
        status = json.dumps(good.status())
    assert c.remote["url"] in {s.url for s in replicas}
    for where in (status, caplog.text, repr(cfg), str(cfg.to_json()["api_key"]) and str(cfg)):
        assert KEY not in where


def test_every_replica_down_falls_back_to_the_local_model(binary, tiny_model):
    servers = start(binary, tiny_model, n=1)
    url = servers[0].url
    servers[0].close()
    req = requests(n_files=1, steps=1)[0]
    with Engine(small_config(max_tokens=24), tiny_model) as local:
        want = local.complete(req).text
    from efim_local.engine.remote import open_remote

    cfg = small_config(backend=[url], max_tokens=24, local_fallback=True)
    with open_remote(cfg, tiny_model) as engine:
        assert engine.complete(req).text == want
    with RemoteEngine(cfg, tiny_model) as remote, pytest.raises(BackendError, match="every backend failed"):
        remote.complete(req)


def test_idle_prefill_warms_the_replicas_slot(replicas, tiny_model):
    """A document opened, the cursor resting: the plan goes out with n_predict = 0, and the first
    keystroke finds it in the server's cache."""
    cur = len(SRC) // 3
    with RemoteEngine(remote_config(replicas), tiny_model) as remote:
        remote.prefill("/repo/warm.py", SRC, cur)
        c = remote.complete(CompletionRequest(SRC, cur, path="/repo/warm.py"))
    assert c.tokens.cached == c.tokens.prompt - 1 and c.remote["miss"] is None
