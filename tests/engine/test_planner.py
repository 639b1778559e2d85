"""Planner properties, with the real tokenizer of the tiny GGUF."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from efim_local.prompt import planner as P
from efim_local.prompt.planner import FileSession, Markers, Planner, PlannerLimits

MARK = Markers(pre=(1,), suf=(2,), mid=(3,))
ALPHABET = st.sampled_from(list("abc XYZ_()=:.,\t\n\r") + ["é", "λ", "日本", "🙂", "def ", "    ", "\r\n"])
docs = st.lists(ALPHABET, max_size=60).map("".join)


def make(model, **limits) -> Planner:
    return Planner(model.tokenize, MARK, PlannerLimits(**({"n_ctx": 4096} | limits)))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=docs, data=st.data(), layout=st.sampled_from(P.LAYOUTS), order=st.sampled_from(["psm", "spm"]))
def test_plan_is_pieces_tokenized_separately(model, doc, data, layout, order):
    cursor = data.draw(st.integers(0, len(doc)))
    pl = Planner(model.tokenize, Markers((1,), (2,), (3,), order), PlannerLimits(n_ctx=4096))
    plan = pl.plan(FileSession(), doc, cursor, layout)
    anchor = pl.anchor_offset(doc, cursor)  # (the line above, for a line of indentation alone)
    pre, mid, suf = (tuple(model.tokenize(t)) for t in (doc[:anchor], doc[anchor:cursor], doc[cursor:]))
    if order == "psm":
        want = (1, *pre, 2, *suf, 3, *mid) if layout == "efim" else (1, *pre, *mid, 2, *suf, 3)
    else:
        want = (2, *suf, 1, *pre, 3, *mid) if layout == "efim" else (2, *suf, 1, *pre, *mid, 3)
    assert plan.tokens == want
    assert plan.middle_text == doc[anchor:cursor]
    # Everything before middle_start stays put while the user types.
    start = plan.middle_start
    assert plan.tokens[start:start + len(mid)] == mid


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=docs, data=st.data(), typed=st.lists(st.sampled_from(list("ab _(\tλ🙂")), min_size=1, max_size=8))
def test_typing_forward_keeps_anchor_and_prefix(model, doc, data, typed):
    cursor = data.draw(st.integers(0, len(doc)))
    pl, s = make(model), FileSession()
    first = pl.plan(s, doc, cursor, "efim")
    for ch in typed:
        doc, cursor = doc[:cursor] + ch + doc[cursor:], cursor + len(ch)
        plan = pl.plan(s, doc, cursor, "efim")
        assert plan.reanchor is None
        # Everything up to the middle is the same tokens as before: fully cacheable.
        head = len(first.tokens) - len(first.middle_tokens)
        assert plan.tokens[:head] == first.tokens[:head]


def test_overflow_trims_prefix_start_and_suffix_end(model):
    line = "value = compute(alpha, beta)\n"
    doc = line * 200 + "x = " + line * 200
    cursor = doc.index("x = ") + 4
    pl = make(model, n_ctx=512, max_middle_tokens=32, reserve_tokens=64)
    plan = pl.plan(FileSession(), doc, cursor, "efim")
    assert plan.reanchor == P.NEW_SESSION
    assert len(plan.tokens) - len(plan.middle_tokens) + 64 + 32 <= 512
    assert plan.prefix_trimmed > 0 and plan.suffix_trimmed > 0
    # Only about eight characters a token of the room are tokenized each side (at line boundaries).
    lo, hi = plan.cut[0], len(doc) - plan.cut[1]
    assert 0 < lo and doc[lo - 1] == "\n" and hi < len(doc) and doc[hi - 1] == "\n"
    full_pre = model.tokenize(doc[lo:P.line_start(doc, cursor)])
    full_suf = model.tokenize(doc[cursor:hi])
    assert plan.prefix_tokens == tuple(full_pre[plan.prefix_trimmed:])  # cut at the start
    assert plan.suffix_tokens == tuple(full_suf[:len(full_suf) - plan.suffix_trimmed])  # cut at the end
    # The prefix keeps most of the budget: nearby code before the cursor matters most.
    assert len(plan.prefix_tokens) >= len(plan.suffix_tokens)


def test_bad_cursor_and_layout(model):
    pl = make(model)
    with pytest.raises(P.PlanError, match="outside the document"):
        pl.plan(FileSession(), "abc", 4)
    with pytest.raises(P.PlanError, match="unknown layout"):
        pl.plan(FileSession(), "abc", 1, "xyz")
