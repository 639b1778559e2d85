"""Healing and the latency budget over a real llama-server (the tiny model): a healed answer is
token-identical to the in-process healed answer, and the budget learns the server's prefill speed
from its own timings and reduces a plan that would not fit."""

from __future__ import annotations

import re

import pytest

from efim_local.bench.peers import LlamaServer
from efim_local.engine import CompletionRequest, Engine
from efim_local.engine.remote import RemoteEngine
from efim_local.engine.remote_steps import heal_grammar
from tests.helpers import llama_server_binary, small_config

SRC = "".join(f"def compute_{i}(value):\n    result = value * {i}\n    return result + {i}\n\n" for i in range(14))


@pytest.fixture(scope="module")
def server(tiny_model):
    b = llama_server_binary()
    if isinstance(b, str):
        pytest.skip(b)
    s = LlamaServer(b, tiny_model, 1024, threads=1, parallel=2)
    yield s
    s.close()


def mid_word_requests():
    """Cursors inside identifiers and keywords: the last token of the middle is backed off."""
    out = []
    for k, m in enumerate(re.finditer(r"[A-Za-z_]{4,}", SRC[:900])):
        if k % 5 == 0:
            for cut in (1, 3):
                cur = m.start() + cut
                out.append(CompletionRequest(SRC, cur, path=f"/repo/h{k}.py"))
    return out


def test_a_healed_remote_answer_equals_the_in_process_healed_answer(server, tiny_model):
    reqs = mid_word_requests()
    with Engine(small_config(max_tokens=16, heal=True), tiny_model) as local:
        want = [local.complete(r) for r in reqs]
    healed = [c for c in want if c.prompt.heal]
    assert len(healed) >= len(reqs) // 2, "the requests should heal"
    with RemoteEngine(small_config(backend=[server.url], max_tokens=16, heal=True), tiny_model) as remote:
        assert remote.status()["heal"] is True
        got = [remote.complete(r) for r in reqs]
    assert [(c.text, c.stop_reason) for c in got] == [(c.text, c.stop_reason) for c in want]
    assert [c.tokens.generated for c in got] == [c.tokens.generated for c in want]


def test_the_heal_grammar_escapes_every_character():
    assert heal_grammar(b'a"\\') == 'root ::= "\\U00000061\\U00000022\\U0000005C" [^\\x00]*'
    assert heal_grammar("é".encode()[:1]) is None  # not whole UTF-8: not healed remotely


def test_the_budget_learns_the_servers_speed_and_reduces_a_plan(server, tiny_model):
    with RemoteEngine(small_config(backend=[server.url], max_tokens=4), tiny_model) as remote:
        assert not remote.speed.known
        for f in range(3):  # full plans (no budget yet): the speed learns from the server's timings
            remote.complete(CompletionRequest(SRC, len(SRC) // 2 + 40 * f, path=f"/repo/b{f}.py"))
        assert remote.speed.known and remote.speed.a > 0
        full_ms = remote.speed.predict_ms(len(remote.model.tokenize(SRC)), 0)
        tight = remote.complete(CompletionRequest(SRC, len(SRC) // 2, path="/repo/tight.py",
                                                  max_prompt_ms=full_ms / 4))
        roomy = remote.complete(CompletionRequest(SRC, len(SRC) // 2, path="/repo/roomy.py",
                                                  max_prompt_ms=full_ms * 100))
        # Growth puts the context back: the full plan is warmed on the replica (n_predict 0), and
        # the next keystroke's plan is whole again, mostly from the server's cache.
        remote.grow("/repo/tight.py")
        again = remote.complete(CompletionRequest(SRC[:len(SRC) // 2] + "x" + SRC[len(SRC) // 2:], len(SRC) // 2 + 1,
                                                  path="/repo/tight.py", max_prompt_ms=full_ms / 4))
    assert tight.context["reduced"] and tight.context["tokens"] < roomy.context["tokens"]
    assert not roomy.context["reduced"]
    # The server computed what the reduced plan sent, not the whole file.
    assert tight.tokens.evaluated < roomy.tokens.evaluated
    assert not again.context["reduced"] and again.tokens.cached > again.tokens.prompt // 2, again.remote


def test_typing_through_a_remote_answer_is_answered_from_its_trail(server, tiny_model):
    """Typing what the answer showed: the next answer starts with the rest of it at once (no
    server call for those tokens), and equals the in-process answer."""

    def session(engine):
        out = []
        for f, cur in enumerate((300, 420, 555)):
            path, text = f"/repo/t{f}.py", SRC
            first = engine.complete(CompletionRequest(text, cur, path=path))
            out.append(first)
            for k in range(1, 3):  # type the answer's first characters, one at a time
                typed = first.text[:k]
                if not typed or "\ufffd" in typed:
                    break
                out.append(engine.complete(CompletionRequest(text[:cur] + typed + text[cur:], cur + k, path=path)))
        return out

    with Engine(small_config(max_tokens=16, heal=True), tiny_model) as local:
        want = session(local)
    with RemoteEngine(small_config(backend=[server.url], max_tokens=16, heal=True), tiny_model) as remote:
        got = session(remote)
    assert [(c.text, c.stop_reason, c.source) for c in got] == [(c.text, c.stop_reason, c.source) for c in want]
    assert sum(c.source == "type-through" for c in got) >= 3
