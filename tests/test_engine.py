"""Engine tests: real llama.cpp inference on the tiny GGUF."""

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from efim_local.engine.engine import CompletionRequest, Engine
from efim_local.engine.stream import StopRules, TextStream
from efim_local.training.corpus import read_texts, stdlib_files

from .conftest import small_config

SOURCES = [t for t in read_texts(stdlib_files(600_000)) if len(t) > 6000]


@pytest.fixture(scope="module", params=["llama", "swa"])
def arch_model(request, tiny_model, tiny_model_swa):
    return tiny_model if request.param == "llama" else tiny_model_swa


@pytest.fixture(scope="module")
def engine(arch_model):
    with Engine(small_config(), arch_model) as e:
        yield e


@pytest.fixture(scope="module")
def reference(arch_model):
    """A second engine whose every answer is computed from an empty cache."""
    with Engine(small_config(n_slots=1), arch_model) as e:
        yield e


def cold(reference, tokens, max_tokens=8):
    return reference.run(tokens, CompletionRequest("", 0, max_tokens=max_tokens), cold=True)


def test_complete_counts_and_reuse(engine, reference):
    doc = SOURCES[3][:1500]
    cur = doc.index("\n", 600) + 5
    a = engine.complete(CompletionRequest(doc, cur, path="a.py"))
    assert a.tokens.cached == 0 and a.tokens.evaluated == a.tokens.prompt > 100
    assert a.reanchor == "new_session"
    # Same request again: everything but the last prompt token is cached.
    b = engine.complete(CompletionRequest(doc, cur, path="a.py"))
    assert b.tokens.evaluated == 1 and b.reanchor is None and b.token_ids == a.token_ids
    assert a.token_ids == cold(reference, engine.plan(CompletionRequest(doc, cur, path="a.py")).tokens).token_ids


def test_efim_typing_evaluates_only_new_middle(engine):
    doc = SOURCES[5][:2000]
    cur = doc.index("\n", 1000) + 1
    engine.complete(CompletionRequest(doc, cur, path="typing.py", layout="efim"))
    for ch in "result = val":
        doc, cur = doc[:cur] + ch + doc[cur:], cur + 1
        out = engine.complete(CompletionRequest(doc, cur, path="typing.py", layout="efim"))
        assert out.reanchor is None
        # Only the re-tokenized middle is evaluated, never the suffix.
        assert out.tokens.evaluated <= len(engine.planner.tokenize(doc[doc.rfind("\n", 0, cur) + 1:cur])) + 1


def test_fim_typing_recomputes_suffix(engine):
    doc = SOURCES[5][:2000]
    cur = doc.index("\n", 1000) + 1
    engine.complete(CompletionRequest(doc, cur, path="fim.py", layout="fim"))
    doc, cur = doc[:cur] + "x" + doc[cur:], cur + 1
    out = engine.complete(CompletionRequest(doc, cur, path="fim.py", layout="fim"))
    assert out.tokens.evaluated > len(engine.planner.tokenize(doc[cur:])) / 2


def test_slots_keep_files_apart(tiny_model):
    with Engine(small_config(n_slots=2), tiny_model) as e:
        docs = [SOURCES[i][:1200] for i in (1, 2)]
        first = [e.complete(CompletionRequest(d, 700, path=f"f{i}")) for i, d in enumerate(docs)]
        again = [e.complete(CompletionRequest(d, 700, path=f"f{i}")) for i, d in enumerate(docs)]
        assert {o.slot for o in first} == {0, 1}
        assert [o.slot for o in again] == [o.slot for o in first]
        assert all(o.tokens.evaluated == 1 for o in again)


def test_stop_rules(engine):
    doc = SOURCES[7][:800]
    out = engine.complete(CompletionRequest(doc, 400, path="s.py", max_tokens=3))
    assert out.stop_reason == "max_tokens" and out.tokens.generated == 3
    out = engine.complete(CompletionRequest(doc, 400, path="s.py", max_tokens=64, stop_at_newline=True))
    assert "\n" not in out.text.strip("\n") and out.stop_reason in ("newline", "eog", "max_tokens")
    out = engine.complete(CompletionRequest(doc, 400, path="s.py", max_tokens=64, max_lines=2))
    assert out.text.strip("\r\n").count("\n") <= 1


def test_sampling_is_seeded(tiny_model):
    engine = Engine(small_config(), tiny_model)
    doc = SOURCES[8][:800]
    r = lambda seed: engine.complete(CompletionRequest(doc, 300, path="t.py", temperature=0.9, top_k=40,
                                                       top_p=0.9, seed=seed, max_tokens=12)).token_ids
    assert r(1) == r(1)
    assert any(r(1) != r(s) for s in (2, 3, 4))
    engine.close()


def test_text_stream_utf8_and_stop_strings():
    s = TextStream(StopRules(stop_strings=("<END>",)))
    out = "".join(s.feed(b) for b in [b"a\xe6", b"\x97", b"\xa5 <E", b"N", b"D> tail"])
    assert out == "a日 " and s.stop_reason == "stop_string" and s.text == "a日 "
    s = TextStream(StopRules(stop_strings=("<END>",)))
    out = "".join(s.feed(b) for b in [b"x <E", b"nd"]) + s.finish()
    assert out == "x <End" and s.stop_reason is None
    s = TextStream(StopRules(stop_at_newline=True))
    out = "".join(s.feed(b) for b in [b"\n", b"  foo", b"(1)\n", b"bar"])
    assert out == "\n  foo(1)" and s.stop_reason == "newline"


EDIT = st.one_of(
    st.tuples(st.just("type"), st.text("abcdef _().:=\n\té", min_size=1, max_size=6)),
    st.tuples(st.just("backspace"), st.integers(1, 4)),
    st.tuples(st.just("move"), st.integers(-200, 200)),
    st.tuples(st.just("insert_far"), st.integers(0, 10_000), st.text("xyz\n#", min_size=1, max_size=5)),
    st.tuples(st.just("delete_far"), st.integers(0, 10_000), st.integers(1, 20)),
)


def apply(doc, cur, edit):
    kind = edit[0]
    if kind == "type":
        return doc[:cur] + edit[1] + doc[cur:], cur + len(edit[1])
    if kind == "backspace":
        k = min(edit[1], cur)
        return doc[:cur - k] + doc[cur:], cur - k
    if kind == "move":
        return doc, max(0, min(len(doc), cur + edit[1]))
    pos = edit[1] % (len(doc) + 1)
    if kind == "insert_far":
        return doc[:pos] + edit[2] + doc[pos:], cur + len(edit[2]) if pos <= cur else cur
    k = min(edit[2], len(doc) - pos)
    new = doc[:pos] + doc[pos + k:]
    return new, cur if cur <= pos else max(pos, cur - k)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(src=st.integers(0, len(SOURCES) - 1), start=st.integers(0, 5000), size=st.integers(50, 2500),
       edits=st.lists(EDIT, min_size=1, max_size=8), layout=st.sampled_from(["efim", "fim"]),
       path=st.sampled_from(["p1.py", "p2.py", "p3.py", "p4.py"]))
def test_reused_kv_is_token_identical_to_empty_cache(engine, reference, src, start, size, edits, layout, path):
    """Exactness contract: any amount of slot reuse gives the same greedy tokens as a cold run."""
    text = SOURCES[src]
    start %= max(1, len(text) - 50)
    doc = text[start:start + size]
    cur = random.Random(start).randint(0, len(doc))
    for edit in [("move", 0), *edits]:
        doc, cur = apply(doc, cur, edit)
        req = CompletionRequest(doc, cur, path=path, layout=layout, max_tokens=6)
        warm = engine.complete(req)
        plan = engine.plan(req)  # the same plan again: the anchor was kept
        assert plan.reanchor is None
        ref = cold(reference, plan.tokens, max_tokens=6)
        assert warm.token_ids == ref.token_ids, (edit, warm.tokens)
        assert warm.tokens.prompt == len(plan.tokens)


def test_token_healing(tiny_model):
    """The backed-off token is spelled out again by the first generated token(s), never shown twice."""
    with Engine(small_config(), tiny_model) as e:
        doc = "import collections\n\ncounts = collections.Coun\n"
        cur = doc.index("Coun") + 4
        r = CompletionRequest(doc, cur, path="heal.py", layout="efim", max_tokens=6, heal=True)
        plan = e.plan(r)
        last = e.model.piece(plan.middle_tokens[-1])
        assert last.endswith(b"n")
        out = e.complete(r)
        spelled = b"".join(e.model.piece(t) for t in out.token_ids)
        assert spelled.startswith(last)  # the constraint held
        assert out.text.encode() == spelled[len(last):][:len(out.text.encode())]
        assert out.tokens.prompt == len(plan.tokens) - 1
        for layout in ("efim", "fim"):  # and the same for standard FIM
            o = e.complete(CompletionRequest(doc, cur, path="heal2.py", layout=layout, max_tokens=4, heal=True))
            assert b"".join(e.model.piece(t) for t in o.token_ids).startswith(last)
