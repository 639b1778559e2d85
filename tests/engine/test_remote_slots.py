"""llama-server's slot files against a real llama-server (one slot, the tiny model): a file whose slot
another file took is saved, restored when it comes back, and answers as in-process; without slot
files, or when the restore fails, the recompute is reported as a miss with its reason.

The servers run with ``--cache-ram 0``: llama-server's own RAM prompt cache would otherwise bring
the file back by itself, and the test could not tell who did.
"""

from __future__ import annotations

import pytest

from efim_local.backend.slotfiles import filename
from efim_local.bench.peers import LlamaServer
from efim_local.engine import CompletionRequest, Engine
from efim_local.engine.remote import RemoteEngine
from efim_local.engine.remote_steps import session_key
from tests.helpers import llama_server_binary, small_config


def source(f: int) -> str:
    return "".join(f"def g{f}_{i}(x):\n    y = x * {i + f}\n    return y + {i}\n\n" for i in range(10))


def request(f: int, typed: str = "") -> CompletionRequest:
    src = source(f)
    cur = src.index("return y + 3") + 7
    return CompletionRequest(src[:cur] + typed + src[cur:], cur + len(typed), path=f"/repo/f{f}.py")


# file 0, file 1 (takes file 0's slot), file 0 again with one more character typed
SEQUENCE = [request(0), request(1), request(0, "y")]


@pytest.fixture(scope="module")
def binary():
    b = llama_server_binary()
    if isinstance(b, str):
        pytest.skip(b)
    return b


@pytest.fixture(scope="module")
def want(tiny_model):
    with Engine(small_config(max_tokens=16), tiny_model) as local:
        return [local.complete(r).text for r in SEQUENCE]


def one_slot(binary, model, *extra):
    return LlamaServer(binary, model, 1024, threads=1, parallel=1, extra=("--cache-ram", "0", *extra))


def run(server, model, before_last=None):
    with RemoteEngine(small_config(backend=[server.url], max_tokens=16), model) as remote:
        out = [remote.complete(r) for r in SEQUENCE[:-1]]
        if before_last is not None:
            before_last()
        out.append(remote.complete(SEQUENCE[-1]))
        return out, remote.status()["backend"]["replicas"][0]


def test_a_file_whose_slot_was_taken_is_restored_from_its_slot_file(binary, tiny_model, want, tmp_path):
    server = one_slot(binary, tiny_model, "--slot-save-path", str(tmp_path))
    try:
        out, status = run(server, tiny_model)
    finally:
        server.close()
    assert [c.text for c in out] == want
    back = out[-1]
    assert back.remote["restored"] > 0 and back.remote["miss"] is None, back.remote
    # The restored slot serves the file's prompt up to what was typed.
    assert back.tokens.cached >= back.remote["expected_cached"] > back.tokens.prompt // 2
    # file 0 saved when file 1 took the slot, file 1 when file 0 came back
    assert status["slot_files"] == {"enabled": True, "saved": 2, "restored": 1, "failed": 0}
    assert (tmp_path / filename(session_key("/repo/f0.py"))).is_file()


def test_without_slot_files_a_switched_file_is_a_reported_miss(binary, tiny_model, want):
    server = one_slot(binary, tiny_model)  # no --slot-save-path: the server answers 501
    try:
        out, status = run(server, tiny_model)
    finally:
        server.close()
    assert [c.text for c in out] == want
    back = out[-1]
    assert back.remote["miss"] == "remote_switched" and back.remote["would_cache"] > back.tokens.cached
    assert status["slot_files"]["enabled"] is False and status["cache_misses"] == 1


def test_a_restore_that_fails_is_a_reported_miss(binary, tiny_model, want, tmp_path):
    server = one_slot(binary, tiny_model, "--slot-save-path", str(tmp_path))
    saved = tmp_path / filename(session_key("/repo/f0.py"))
    try:
        out, status = run(server, tiny_model, before_last=lambda: saved.write_bytes(b"not a slot file"))
    finally:
        server.close()
    assert [c.text for c in out] == want
    assert out[-1].remote["miss"] == "remote_restore_failed", out[-1].remote
    assert status["slot_files"]["failed"] == 1
