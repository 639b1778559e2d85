"""Engine tests: real llama.cpp inference on the tiny GGUF."""

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from efim_local.engine.engine import CompletionRequest, Engine
from efim_local.request import Options
from efim_local.prompt import planner as P

from tests.helpers import EDIT, SOURCES, apply, small_config


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


def cold(reference, tokens, max_tokens=8, closers=""):
    return reference.run(tokens, Options(max_tokens=max_tokens), cold=True, closers=closers)


def test_complete_counts_and_reuse(engine, reference):
    doc = SOURCES[3][:1500]
    cur = doc.index("\n", 600) + 5
    a = engine.complete(CompletionRequest(doc, cur, path="a.py"))
    assert a.tokens.cached == 0 and a.tokens.evaluated == a.tokens.prompt > 100
    assert a.reanchor == "new_session"
    # Same request again: everything is cached, the first token's logits too (Decoder.kept_logits).
    b = engine.complete(CompletionRequest(doc, cur, path="a.py"))
    assert b.tokens.evaluated == 0 and b.reanchor is None and b.token_ids == a.token_ids
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
        assert all(o.tokens.evaluated == 0 for o in again)  # (the first token's logits were kept too)


def test_max_tokens_stops(engine):
    doc = SOURCES[7][:800]
    cur = doc.index("passed-in") + 6  # (mid-word; at 400 the cursor was in a docstring's closing quotes: closers)
    out = engine.complete(CompletionRequest(doc, cur, path="s.py", max_tokens=3, ignore_eog=True))
    assert out.stop_reason == "max_tokens" and out.tokens.generated == 3


def test_line_rules_cut_the_same_tokens_at_a_line_end(tiny_model):
    """At temperature 0 a request with a line rule gets the text of the same request without one, cut
    at the end of its first (or n-th) line: a rule that did nothing returns all the lines (and stops at
    max_tokens), one that cut elsewhere leaves no newline next."""
    doc, cur = SOURCES[6][:800], 400  # the tiny llama model writes lines here (the sliding-window one nowhere)
    with Engine(small_config(), tiny_model) as e:
        ask = lambda **rule: e.complete(CompletionRequest(doc, cur, path="l.py", max_tokens=64, ignore_eog=True,
                                                          **rule))
        free = ask().text
        assert free.strip().count("\n") >= 2  # (the checks below mean something)
        for rule, reason, lines in ((dict(stop_at_newline=True), "newline", 1), (dict(max_lines=2), "max_lines", 2)):
            out = ask(**rule)
            assert out.stop_reason == reason
            assert free.startswith(out.text) and free[len(out.text)] == "\n"
            assert out.text.strip("\r\n").count("\n") == lines - 1


def test_sampling_is_seeded(tiny_model):
    with Engine(small_config(), tiny_model) as engine:
        doc = SOURCES[8][:800]
        r = lambda seed: engine.complete(CompletionRequest(doc, 300, path="t.py", temperature=0.9, top_k=40,
                                                           top_p=0.9, seed=seed, max_tokens=12)).token_ids
        assert r(1) == r(1)
        assert any(r(1) != r(s) for s in (2, 3, 4))


# -- exactness: reused KV gives the tokens of a cold run ------------------------------------------

# One editing session through every kind of edit, with the planner path each must take:
# (what the user does, as an EDIT computed from the document, cursor and anchor; the re-anchor reason).
SCRIPT = [
    (lambda d, c, a: ("move", 0), P.NEW_SESSION),
    (lambda d, c, a: ("type", "x = f(a"), None),  # typing: the middle grows
    (lambda d, c, a: ("type", "é\t"), None),  # multi-byte and tab
    (lambda d, c, a: ("backspace", 2), None),  # backspace within the middle
    (lambda d, c, a: ("type", ")\n    y"), None),  # a newline typed keeps the anchor
    (lambda d, c, a: ("move", 0), None),  # the same request again
    (lambda d, c, a: ("backspace", c - P.line_start(d, c) + 1), None),  # backspace joins lines typed since
    (lambda d, c, a: ("backspace", c - a + 1), P.CURSOR_BEFORE_ANCHOR),  # backspace past the anchor
    (lambda d, c, a: ("move", -300), P.CURSOR_BEFORE_ANCHOR),  # cursor moved up, before the anchor
    (lambda d, c, a: ("move", 7), P.SUFFIX_CHANGED),  # cursor moved forward over the suffix
    (lambda d, c, a: ("insert_far", 0, "# header\n"), P.EDIT_BEFORE_ANCHOR),  # far insert before the cursor
    (lambda d, c, a: ("delete_far", c + 400, 20), P.SUFFIX_CHANGED),  # far delete after the cursor
    (lambda d, c, a: ("delete_far", 10, 5), P.EDIT_BEFORE_ANCHOR),  # far delete before the cursor
    (lambda d, c, a: ("insert_far", c + 300, "z = 1\n"), P.SUFFIX_CHANGED),  # far insert after the cursor
    (lambda d, c, a: ("type", "q"), None),
    (lambda d, c, a: ("pair", "("), None),  # auto-pairs: ")" after the cursor keeps the anchor
    (lambda d, c, a: ("pair", '"'), None),
    (lambda d, c, a: ("type", "s"), None),
    (lambda d, c, a: ("move", 1), None),  # typed over the closers: the suffix is the anchor's again
    (lambda d, c, a: ("move", 1), None),
    (lambda d, c, a: ("move", 1), P.SUFFIX_CHANGED),  # past the suffix's start
]


@pytest.mark.parametrize("layout", ["efim", "fim"])
def test_every_edit_kind_reuses_kv_exactly(engine, reference, layout):
    """A scripted session: each edit takes its planner path, and every answer equals a cold run."""
    doc = SOURCES[2][1000:3400]
    cur = doc.index("\n", 1200) + 1
    path = f"script-{layout}.py"
    engine.forget(path)
    for i, (step, want) in enumerate(SCRIPT):
        anchor = engine.session(path).anchor
        edit = step(doc, cur, anchor.offset if anchor else 0)
        doc, cur = apply(doc, cur, edit)
        req = CompletionRequest(doc, cur, path=path, layout=layout, max_tokens=6)
        warm = engine.complete(req)
        assert warm.reanchor == want, (i, edit)
        if want is None:
            assert warm.tokens.cached > 0, (i, edit)  # the anchor was kept, and so was its KV
        plan = engine.plan(req)
        assert plan.reanchor is None
        assert warm.token_ids == cold(reference, plan.tokens, 6, plan.closers).token_ids, (i, edit, warm.tokens)
        assert warm.tokens.prompt == len(plan.tokens)


# Few examples (derandomized, like every Hypothesis test here: tests/conftest.py), each a whole
# editing session; the scripted test above and the explicit examples below cover each edit kind.
EXACT = settings(max_examples=20, suppress_health_check=[HealthCheck.function_scoped_fixture])


@EXACT
@given(src=st.integers(0, len(SOURCES) - 1), start=st.integers(0, 5000), size=st.integers(50, 2500),
       at=st.integers(0, 2500), edits=st.lists(EDIT, min_size=1, max_size=8), layout=st.sampled_from(["efim", "fim"]),
       path=st.sampled_from(["p1.py", "p2.py", "p3.py", "p4.py"]))
# The important edit kinds, whatever the generator draws (4 files share 3 slots):
@example(src=0, start=1000, size=1500, at=700, layout="efim", path="p1.py",
         edits=[("type", "x = f(a"), ("type", "b)\n"), ("type", "é"), ("backspace", 4)])  # typing, backspace
@example(src=1, start=0, size=2000, at=1500, layout="fim", path="p2.py",
         edits=[("type", "ab"), ("backspace", 3), ("move", -150), ("move", 60)])  # cursor before the anchor, back
@example(src=3, start=2000, size=2500, at=1200, layout="efim", path="p3.py",
         edits=[("insert_far", 10, "#\n"), ("delete_far", 2200, 20), ("type", "x")])  # far insert, far delete
@example(src=4, start=500, size=2500, at=2400, layout="fim", path="p4.py",
         edits=[("delete_far", 100, 20), ("insert_far", 2450, "xyz\n"), ("type", "\n\t")])  # same, standard FIM
@example(src=5, start=0, size=50, at=0, layout="efim", path="p1.py",
         edits=[("backspace", 4), ("type", "\n"), ("move", 200)])  # a tiny document, cursor at both ends
def test_reused_kv_is_token_identical_to_empty_cache(engine, reference, src, start, size, at, edits, layout, path):
    """Exactness contract: any amount of slot reuse gives the same greedy tokens as a cold run."""
    text = SOURCES[src]
    start %= max(1, len(text) - 50)
    doc = text[start:start + size]
    cur = at % (len(doc) + 1)
    for edit in [("move", 0), *edits]:
        doc, cur = apply(doc, cur, edit)
        req = CompletionRequest(doc, cur, path=path, layout=layout, max_tokens=6)
        warm = engine.complete(req)
        plan = engine.plan(req)  # the same plan again: the anchor was kept
        assert plan.reanchor is None
        ref = cold(reference, plan.tokens, 6, plan.closers)
        assert warm.token_ids == ref.token_ids, (edit, warm.tokens)
        assert warm.tokens.prompt == len(plan.tokens)


@pytest.mark.parametrize("typed", ["counts = collections.Coun", "x = ", "    ", "f(", "s = \"", "t = '"])
def test_token_healing(tiny_model, typed):
    """The backed-off tokens (every trailing one that could merge with what follows: a partial word,
    a space, indentation, a bracket, a quote) are spelled out again by the first
    generated tokens, never shown twice."""
    with Engine(small_config(), tiny_model) as e:
        doc = "import collections\n\n" + typed + "\n"
        cur = len(doc) - 1
        r = CompletionRequest(doc, cur, path="heal.py", layout="efim", max_tokens=6, heal=True)
        plan = e.plan(r)
        pieces = [e.model.piece(t) for t in plan.middle_tokens]
        k = e.healer.backoff(pieces)
        assert k >= 1 and e.healer.extends(pieces[-1])
        last = b"".join(pieces[len(pieces) - k:])
        out = e.complete(r)
        spelled = b"".join(e.model.piece(t) for t in out.token_ids)
        if out.stop_reason != "eog" or len(spelled) >= len(last):
            assert spelled.startswith(last)  # the constraint held
        assert spelled[len(last):].decode("utf-8", "replace").startswith(out.text)
        assert out.tokens.prompt == len(plan.tokens) - k
        for layout in ("efim", "fim"):  # and the same for standard FIM
            o = e.complete(CompletionRequest(doc, cur, path="heal2.py", layout=layout, max_tokens=4, heal=True))
            assert b"".join(e.model.piece(t) for t in o.token_ids).startswith(last)


def test_status_describes_the_model_with_its_real_size(tiny_model):
    """Not llama.cpp's size class ("?B", or "1B" for a 0.5B): the GGUF's size label, else the count."""
    from efim_local.engine.models import count_label, describe

    with Engine(small_config(), tiny_model) as e:
        d = describe(e.model)
        assert "?" not in d and d.endswith(e.model.description().split(" ", 2)[2])
        assert f"{count_label(e.model.n_params)} parameters" in d and e.status()["description"] == d
    assert [count_label(n) for n in (2_400_000, 494_000_000, 1_540_000_000, 950)] == ["2.4M", "494M", "1.5B", "950"]
