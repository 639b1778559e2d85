"""The EFIM planner with a fake tokenizer (pure Python; tests/engine/test_planner.py uses the real one).

The fake tokenizer is greedy longest-match over a few multi-character tokens, so, like BPE, the
tokens of a text depend on its neighbours: "ab" + "c" is not "abc". A planner that tokenized the
whole document, or cut pieces at the wrong place, gives other tokens than the pieces on their own.
"""

import re
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from efim_local.errors import PlanError
from efim_local.prompt import planner as P
from efim_local.prompt.planner import FileSession, Markers, Planner, PlannerLimits

PIECES = ["def ", "    ", "abc", "ab", "bc", "XYZ", "\r\n", "()", "= ", "日本", "\n\n"]
IDS = {s: 10 + i for i, s in enumerate(PIECES)}


# Longest first: at each position the regex takes the longest piece there, else one character
# (as a loop over the lengths would, twenty times slower: the planner tests tokenize megabytes).
TOKEN = re.compile("|".join(map(re.escape, sorted(PIECES, key=len, reverse=True))) + "|.", re.S)


class _Ids(dict):
    def __missing__(self, ch):  # one character: its own token
        self[ch] = 1000 + ord(ch)
        return self[ch]


TOKEN_IDS = _Ids(IDS)


def tokenize(text: str) -> list[int]:
    return list(map(TOKEN_IDS.__getitem__, TOKEN.findall(text)))


MARKERS = [Markers((1,), (2,), (3,)), Markers((1,), (2,), (3,), "spm"),
           Markers((1, 5), (2, 6), (3, 7), "psm", bos=(4,)),  # text markers of several tokens, and a BOS
           Markers((1,), (2,), (), "spm", bos=(4,))]  # no middle marker (Codestral)
ALPHABET = st.sampled_from(list("abc XYZ_()=:.,\t\n\r") + ["é", "日本", "🙂", "def ", "    ", "\r\n"])
docs = st.lists(ALPHABET, max_size=60).map("".join)


def make(markers=MARKERS[0], **limits) -> Planner:
    return Planner(tokenize, markers, PlannerLimits(**({"n_ctx": 4096} | limits)))


def toks(text):
    return tuple(tokenize(text))


def test_the_fake_tokenizer_depends_on_context():
    assert toks("abc") != toks("ab") + toks("c") and toks("def x") != toks("de") + toks("f x")


def test_plan_of_a_small_example():
    plan = make().plan(FileSession(), "x = 1\nabc()\n", 8, "efim")  # cursor after "ab"
    assert plan.tokens == (1, *toks("x = 1\n"), 2, *toks("c()\n"), 3, *toks("ab"))
    assert plan.middle_text == "ab" and plan.reanchor == P.NEW_SESSION and plan.middle_start == len(plan.tokens) - 1


@given(doc=docs, data=st.data(), layout=st.sampled_from(P.LAYOUTS), markers=st.sampled_from(MARKERS))
def test_plan_is_pieces_tokenized_separately(doc, data, layout, markers):
    cursor = data.draw(st.integers(0, len(doc)))
    pl = make(markers)
    s = FileSession()
    plan = pl.plan(s, doc, cursor, layout)
    anchor = P.anchor_at(doc, cursor)  # (the line above too, when the line holds only indentation)
    pre, mid, suf = toks(doc[:anchor]), toks(doc[anchor:cursor]), toks(doc[cursor:])
    m = markers
    if m.order == "psm":
        want = (*m.bos, *m.pre, *pre, *m.suf, *suf, *m.mid, *mid) if layout == "efim" else \
            (*m.bos, *m.pre, *pre, *mid, *m.suf, *suf, *m.mid)
    else:
        want = (*m.bos, *m.suf, *suf, *m.pre, *pre, *m.mid, *mid) if layout == "efim" else \
            (*m.bos, *m.suf, *suf, *m.pre, *pre, *mid, *m.mid)
    assert plan.tokens == want
    assert (plan.prefix_tokens, plan.middle_tokens, plan.suffix_tokens) == (pre, mid, suf)
    assert plan.middle_text == doc[anchor:cursor] and s.anchor.offset == anchor
    # Everything before middle_start stays put while the user types.
    start = plan.middle_start
    assert plan.tokens[start:start + len(mid)] == mid
    assert plan.tokens[:start] == pl.stable_tokens(layout, s.anchor)


@given(doc=docs, data=st.data(), layout=st.sampled_from(P.LAYOUTS),
       typed=st.lists(st.sampled_from(list("ab _(\tλ🙂") + ["\n", "c"]), min_size=1, max_size=8))
def test_typing_forward_keeps_anchor_and_prefix(doc, data, layout, typed):
    cursor = data.draw(st.integers(0, len(doc)))
    pl, s = make(), FileSession()
    first = pl.plan(s, doc, cursor, layout)
    anchor = s.anchor
    for ch in typed:
        doc, cursor = doc[:cursor] + ch + doc[cursor:], cursor + len(ch)
        plan = pl.plan(s, doc, cursor, layout)
        assert plan.reanchor is None and s.anchor is anchor
        # Everything up to the middle is the same tokens as before: fully cacheable.
        assert plan.tokens[:plan.middle_start] == first.tokens[:first.middle_start]
        assert plan.middle_tokens == toks(doc[anchor.offset:cursor])  # a newline typed stays in the middle
    assert s.reanchors == 1


def test_reanchor_reasons():
    pl, s = make(max_middle_tokens=8), FileSession()
    doc = "def f(x):\n    return x\n\nprint(f(1))\n"
    cur = doc.index("return") + 3
    assert pl.plan(s, doc, cur).reanchor == P.NEW_SESSION
    assert pl.plan(s, doc, cur).reanchor is None
    doc2 = doc[:cur] + "u" + doc[cur:]
    assert pl.plan(s, doc2, cur + 1).reanchor is None
    assert pl.plan(s, doc2, cur + 1, "fim").reanchor == P.LAYOUT_CHANGED
    assert pl.plan(s, "# hi\n" + doc2, cur + 6, "fim").reanchor == P.EDIT_BEFORE_ANCHOR
    doc3 = "# hi\n" + doc2
    assert pl.plan(s, doc3, 2, "fim").reanchor == P.CURSOR_BEFORE_ANCHOR
    assert pl.plan(s, doc3 + "x", 2, "fim").reanchor == P.SUFFIX_CHANGED
    long = doc3 + "x"
    reasons = []
    for i in range(12):  # "word " is 5 tokens of the fake tokenizer: the middle passes 8 tokens
        long = long[:2] + "word " + long[2:]
        reasons.append(pl.plan(s, long, 2 + 5 * (i + 1), "fim").reanchor)
    assert reasons[:1] == [None] and P.MIDDLE_TOO_LONG in reasons
    assert s.reanchors == 5 + reasons.count(P.MIDDLE_TOO_LONG)


@pytest.mark.parametrize("layout", P.LAYOUTS)
def test_auto_paired_closers_keep_the_anchor(layout):
    """Typing "(" makes the editor insert ")" after the cursor: the anchor (and its cached suffix)
    stays; the plan reports the closer, which the answer must not repeat (stream.py stops there)."""
    pl, s = make(), FileSession()
    doc = "x = 1\nprint\ny = 2\n"
    cur = doc.index("print") + 5
    first = pl.plan(s, doc, cur, layout)
    for typed, closers in [("(", ")"), ('("', '")'), ('(["', '"])')]:
        d = doc[:cur] + typed + closers + doc[cur:]
        plan = pl.plan(s, d, cur + len(typed), layout)
        assert plan.reanchor is None and plan.closers == closers
        assert plan.suffix_tokens == first.suffix_tokens and plan.middle_text == "print" + typed
    over = doc[:cur] + "()" + doc[cur:]  # the closer typed over: the suffix is the anchor's again
    assert pl.plan(s, over, cur + 2, layout).closers == ""
    assert pl.plan(s, over, cur + 2, layout).reanchor is None
    other = doc[:cur] + "(x" + doc[cur:]  # text that is not a closer re-anchors, as before
    plan = pl.plan(s, other, cur + 1, layout)
    assert plan.reanchor == P.SUFFIX_CHANGED and plan.closers == ""
    many = doc[:cur] + "(" + ")" * (P.MAX_CLOSERS + 1) + doc[cur:]
    assert pl.plan(s, many, cur + 1, layout).reanchor == P.SUFFIX_CHANGED


def test_a_very_long_line_is_anchored_at_the_cursor():
    pl, s = make(max_middle_tokens=8), FileSession()
    doc = "import os\n" + "x, " * 30 + "\n"
    cur = len(doc) - 1
    plan = pl.plan(s, doc, cur, "efim")
    assert s.anchor.offset == cur and plan.middle_tokens == () and plan.prefix_tokens == toks(doc[:cur])
    assert pl.plan(s, doc[:cur] + "y" + doc[cur:], cur + 1, "efim").reanchor is None  # and typing goes on from there


def test_overflow_trims_prefix_start_and_suffix_end():
    line = "value = compute(alpha, beta)\n"
    doc = line * 40 + "x = " + line * 40
    cursor = doc.index("x = ") + 4
    pl = make(n_ctx=512, max_middle_tokens=32, reserve_tokens=64)
    plan = pl.plan(FileSession(), doc, cursor, "efim")
    assert plan.reanchor == P.NEW_SESSION
    assert len(plan.tokens) - len(plan.middle_tokens) + 64 + 32 <= 512
    assert plan.prefix_trimmed > 0 and plan.suffix_trimmed > 0
    full_pre, full_suf = toks(doc[:P.line_start(doc, cursor)]), toks(doc[cursor:])
    assert plan.prefix_tokens == full_pre[plan.prefix_trimmed:]  # cut at the start
    assert plan.suffix_tokens == full_suf[:len(full_suf) - plan.suffix_trimmed]  # cut at the end
    # The prefix keeps most of the budget: nearby code before the cursor matters most.
    assert len(plan.prefix_tokens) >= len(plan.suffix_tokens)


def test_context_overflow_reason_when_output_does_not_fit():
    pl = make(n_ctx=300, max_middle_tokens=32, reserve_tokens=16)
    s = FileSession()
    doc = "a = 1\n" * 30
    assert pl.plan(s, doc, len(doc)).reanchor == P.NEW_SESSION
    # A request that wants more output than was reserved forces a trim.
    plan = pl.plan(s, doc, len(doc), reserve=200)
    assert plan.reanchor == P.CONTEXT_OVERFLOW
    assert len(plan.tokens) + 200 <= 300 and plan.prefix_trimmed > 0


def test_bad_requests():
    pl = make()
    with pytest.raises(PlanError, match="outside the document"):
        pl.plan(FileSession(), "abc", 4)
    with pytest.raises(PlanError, match="outside the document"):
        pl.plan(FileSession(), "abc", -1)
    with pytest.raises(PlanError, match="unknown layout"):
        pl.plan(FileSession(), "abc", 1, "xyz")
    with pytest.raises(PlanError, match="has no room for a prompt"):
        make(n_ctx=64, reserve_tokens=60).plan(FileSession(), "abc", 1)


@given(doc=docs.map(lambda d: d * 4), data=st.data(), layout=st.sampled_from(P.LAYOUTS),
       budget=st.integers(0, 120))
def test_latency_budget_keeps_the_context_nearest_the_cursor(doc, data, layout, budget):
    cursor = data.draw(st.integers(0, len(doc)))
    pl, s = make(MARKERS[2]), FileSession()
    plan = pl.plan(s, doc, cursor, layout, budget=P.Budget(tokens=budget))
    assert plan.reanchor == P.LATENCY_BUDGET
    fixed = 7  # bos + two tokens per marker
    # Within the budget, except that a plan always gets some context (P.MIN_CONTEXT tokens).
    assert len(plan.tokens) <= max(budget, fixed + len(plan.middle_tokens) + P.MIN_CONTEXT)
    assert len(plan.prefix_tokens) + len(plan.suffix_tokens) >= min(P.MIN_CONTEXT, len(toks(doc[:s.anchor.offset]))
                                                                     + len(toks(doc[cursor:])))
    full_pre, full_suf = toks(doc[:s.anchor.offset]), toks(doc[cursor:])
    assert plan.prefix_tokens == full_pre[len(full_pre) - len(plan.prefix_tokens):]  # the end of the prefix
    assert plan.suffix_tokens == full_suf[:len(plan.suffix_tokens)]  # the start of the suffix
    assert plan.reduced == (len(full_pre) + len(full_suf) > len(plan.prefix_tokens) + len(plan.suffix_tokens))
    # Idle time grows it back: the full anchor has the same texts and every token.
    full = pl.full_anchor(s.anchor)
    assert (full.offset, full.prefix_tokens, full.suffix_tokens, full.reduced) == \
        (s.anchor.offset, full_pre, full_suf, False)


@given(text=st.text("ab\n\r", max_size=20), data=st.data())
def test_line_start(text, data):
    offset = data.draw(st.integers(0, len(text)))
    start = P.line_start(text, offset)
    assert start <= offset and "\n" not in text[start:offset] and (start == 0 or text[start - 1] == "\n")


# -- files bigger than a slot: stable windows ---------------------------------------------------------
BIG = "".join(f"line {i:04d} = value_{i} + other\n" for i in range(1500))  # ~50k fake tokens


def common(a, b):
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def test_a_cursor_move_inside_the_window_keeps_its_head():
    """The prefix of a file bigger than the slot starts at an aligned token that stays put while the
    cursor moves inside the window: the next plan shares everything up to the earlier anchor."""
    pl, s = make(n_ctx=4096, max_middle_tokens=64), FileSession()
    lines = BIG.splitlines(keepends=True)
    at = lambda n: sum(map(len, lines[:n]))
    first = pl.plan(s, BIG, at(800), "efim")
    assert first.prefix_trimmed > 0 and s.anchor.window == first.prefix_trimmed
    for n in (803, 795, 804):  # down, up, down: the window stays
        plan = pl.plan(s, BIG, at(n), "efim")
        assert plan.reanchor in (P.SUFFIX_CHANGED, P.CURSOR_BEFORE_ANCHOR) and s.anchor.window == first.prefix_trimmed
    back = pl.plan(s, BIG, at(800), "efim")
    assert back.tokens == first.tokens  # the same window and cursor: the same plan
    moved = pl.plan(s, BIG, at(805), "efim")
    # Everything up to the earlier anchor is shared: a jump costs the lines between and the suffix.
    shared = common(back.tokens, moved.tokens)
    assert shared >= 1 + len(back.prefix_tokens) - 1


def test_the_window_moves_in_aligned_steps_when_the_cursor_leaves_it():
    pl, s = make(n_ctx=4096, max_middle_tokens=64), FileSession()
    lines = BIG.splitlines(keepends=True)
    at = lambda n: sum(map(len, lines[:n]))
    starts = []  # (characters cut before the tokenized text, the window's first token in it)
    for n in range(400, 1500, 50):
        pl.plan(s, BIG, at(n), "efim")
        starts.append((s.anchor.cut[0], s.anchor.window))
    assert starts == sorted(starts) and len(set(starts)) > 3  # it follows the cursor down...
    assert len({c for c, _ in starts}) > 1  # (far enough that the text is cut in characters too)
    steps = {b[1] - a[1] for a, b in zip(starts, starts[1:]) if b[0] == a[0] and b != a}
    assert min(steps) >= 16  # ...in steps, never token by token
    cuts = {b[0] - a[0] for a, b in zip(starts, starts[1:]) if b[0] != a[0]}
    assert min(cuts) >= pl.text_span() // 8 - len(lines[0])


def test_a_file_of_megabytes_is_tokenized_only_around_the_cursor():
    """A re-anchor tokenizes at most a span of characters each side of the cursor, cut at line
    starts and ends, and the cut stays put while the cursor moves inside it."""
    seen = []
    pl = Planner(lambda t: seen.append(len(t)) or tokenize(t), MARKERS[0], PlannerLimits(n_ctx=4096))
    s, doc = FileSession(), BIG * 40  # about 2 MB
    lines = doc.splitlines(keepends=True)
    at = lambda n: sum(map(len, lines[:n]))
    plan = pl.plan(s, doc, at(30000) + 3, "efim")
    span = pl.text_span()
    assert max(seen) <= span + len(lines[0]) and sum(seen) <= 2 * span + 2 * len(lines[0])
    lo, cut_end = s.anchor.cut
    assert doc[lo - 1] == "\n" and (len(doc) - cut_end == len(doc) or doc[len(doc) - cut_end - 1] == "\n")
    assert plan.prefix_tokens == toks(doc[lo:at(30000)])[s.anchor.window:]
    for n in (30040, 29990):  # down and up inside the cut: the same text tokenized, the same window
        pl.plan(s, doc, at(n), "efim")
        assert s.anchor.cut[0] == lo
    far = pl.plan(s, doc, at(50000), "efim")
    assert s.anchor.cut[0] > lo and far.cut == s.anchor.cut


def test_a_cut_leaves_the_prefix_at_least_half_a_span_of_text():
    """Moving up through the cut, a line longer than the span before the anchor, a file of one
    line: the tokenized prefix text never shrinks below half a span (the cut moves instead)."""
    pl = Planner(tokenize, MARKERS[0], PlannerLimits(n_ctx=4096))
    span, s, doc = pl.text_span(), FileSession(), BIG * 40
    lines = doc.splitlines(keepends=True)
    at = lambda n: sum(map(len, lines[:n]))
    cuts = set()
    for n in range(30000, 28500, -25):
        pl.plan(s, doc, at(n), "efim")
        assert span // 2 <= at(n) - s.anchor.cut[0] <= span
        cuts.add(s.anchor.cut[0])
    assert 1 < len(cuts) < 1500 // 25 // 2  # it moved, in steps
    blob = "import x\n" + "DATA = '" + "q" * (span + 5000) + "'\n" + "def f():\n    return 1\n" + "tail\n" * 10
    cursor = blob.index("    return")
    pl.plan(s := FileSession(), blob, cursor, "efim")
    assert s.anchor.offset - s.anchor.cut[0] == span  # cut inside the long line, a span up
    one = "x = 1; " * (span // 2)  # no newline at all
    plan = pl.plan(s := FileSession(), one, len(one) // 2, "efim")
    assert s.anchor.offset == len(one) // 2 and s.anchor.offset - s.anchor.cut[0] == span and plan.prefix_tokens


def test_the_near_window_stays_put_for_dozens_of_lines_and_a_budget_starts_from_it():
    """The near window (the last 1/NEAR of the room) keeps its start while the cursor moves a few
    dozen lines, across window moves; a budgeted re-anchor whose near window a slot holds starts its
    prefix there, keeps that head and spends the budget on the lines after it and the suffix."""
    pl, s = make(n_ctx=4096, max_middle_tokens=64), FileSession()
    lines = BIG.splitlines(keepends=True)  # 32 fake tokens a line
    at = lambda n: sum(map(len, lines[:n]))
    pl.plan(s, BIG, at(1000), "efim")
    near_at = s.anchor.near_at
    windows = set()
    for n in [*range(1001, 1016), *range(1015, 995, -1)]:  # 15 lines down, then 5 above the start
        pl.plan(s, BIG, at(n), "efim")
        assert s.anchor.near_at == near_at
        windows.add(s.anchor.window)
    assert len(windows) > 1  # the window moved meanwhile
    near = pl.near_anchor(s.anchor)
    slot = pl.stable_tokens("efim", near)  # the near plan, as growth leaves it in a slot
    cached = lambda toks: common(toks, slot)
    plan = pl.plan(s, BIG, at(1003), "efim", budget=P.Budget(cached=cached, new_for=lambda n: 200))
    a = s.anchor
    assert a.reduced and a.base == a.inner and a.near_at == near_at and a.head >= len(near.prefix_tokens) - 40
    assert plan.prefix_tokens == a.full_prefix[near_at:][:a.head] + a.full_prefix[near_at + a.head + a.gap:]
    assert len(plan.prefix_tokens) - a.head + len(plan.suffix_tokens) <= 200


def test_the_nearest_window_sits_in_the_near_window_stays_put_and_a_budget_starts_from_it():
    """Inside the near window, the nearest window (a quarter of it) keeps its start while the cursor
    moves a few lines; a budgeted re-anchor whose nearest window a slot holds (and not the near
    window) starts its prefix there; once a slot holds the near plan, the budget starts from that."""
    pl, s = make(n_ctx=4096, max_middle_tokens=64), FileSession()
    lines = BIG.splitlines(keepends=True)  # 32 fake tokens a line
    at = lambda n: sum(map(len, lines[:n]))
    pl.plan(s, BIG, at(1000), "efim")
    a = s.anchor
    room = pl.space(8) // P.NEAR // P.NEAREST
    assert a.inner < a.innermost and room // 2 <= len(a.full_prefix) - a.window - a.innermost <= room
    nearest_at = a.window + a.innermost
    for n in (1001, 1002, 1003, 999):
        pl.plan(s, BIG, at(n), "efim")
        assert s.anchor.window + s.anchor.innermost == nearest_at
    nearest, near = pl.near_anchor(s.anchor, nearest=True), pl.near_anchor(s.anchor)
    assert list(nearest.prefix_tokens) == list(s.anchor.full_prefix[nearest_at:])
    assert len(nearest.suffix_tokens) <= len(nearest.prefix_tokens) // 3 + 1
    budget = lambda slot: P.Budget(cached=lambda toks: common(toks, slot), new_for=lambda n: 40)
    plan = pl.plan(s, BIG, at(1000), "efim", budget=budget(pl.stable_tokens("efim", nearest)))
    b = s.anchor
    assert b.reduced and b.base == b.innermost and b.head == len(nearest.prefix_tokens)
    assert plan.prefix_tokens[:b.head] == nearest.prefix_tokens and len(plan.prefix_tokens) > b.head  # and line 999
    # A near plan grown part of the way (a head, then the budget's tail after a gap) holds more of the
    # near window, but the nearest plan holds the lines nearest the cursor whole: it is taken.
    near_plan, nearest_plan = pl.stable_tokens("efim", near), pl.stable_tokens("efim", nearest)
    lead = len(pl.head_tokens(()))
    for grown in (100, 200, len(near.prefix_tokens) - len(nearest.prefix_tokens) - 10):
        both = lambda toks, grown=grown: max(common(toks, near_plan[:lead + grown]), common(toks, nearest_plan))
        pl.plan(s, BIG, at(1000), "efim", budget=P.Budget(cached=both, new_for=lambda n: 40))
        assert s.anchor.base == s.anchor.innermost and s.anchor.head == len(nearest.prefix_tokens), grown
    pl.plan(s, BIG, at(1000), "efim", budget=budget(near_plan))
    assert s.anchor.base == s.anchor.inner and s.anchor.head == len(near.prefix_tokens)


def test_a_small_slot_has_no_near_window():
    pl = make(n_ctx=512, max_middle_tokens=32, reserve_tokens=64)
    assert pl.space(64) // P.NEAR < P.MIN_NEAR
    s = FileSession()
    for n in (300, 340, 380):
        pl.plan(s, BIG, n * 33, "efim")
        assert s.anchor.inner == 0 and pl.near_anchor(s.anchor) is None


def test_a_small_file_has_no_window():
    pl, s = make(), FileSession()
    plan = pl.plan(s, BIG[:2000], 1000, "efim")
    assert s.anchor.window == 0 and plan.prefix_trimmed == 0


def test_a_slower_model_gets_a_smaller_near_window():
    """near_share: the largest share of the room whose near plan (its prefix and a third as many
    suffix tokens) computes within the time allowed; none when even 1/64 would not, or it would hold
    fewer than MIN_NEAR tokens. The planner's near windows follow its share."""
    ms = lambda tokens_per_s: (lambda n: 1000 * n / tokens_per_s)
    assert P.near_share(3770, ms(200), 5000) == 8  # 471 + 157 tokens in 3.1 s
    assert P.near_share(3770, ms(35), 5000) == 32  # an eighth: 18 s; a sixteenth: 9 s; 1/32: 4.5 s
    assert P.near_share(3770, ms(5), 5000) == 0
    assert P.near_share(3770, ms(1e6), 5000) == 8
    assert P.near_share(3000, ms(1e6), 5000) == 8 and P.near_share(600, ms(1e6), 5000) == 8
    assert P.near_share(400, ms(1e6), 5000) == 0  # 400 // 8 < MIN_NEAR
    assert P.near_share(3000, ms(70), 5000) == 16 and P.near_share(1000, ms(70), 5000) == 8
    lines = BIG.splitlines(keepends=True)
    cursor = sum(map(len, lines[:1000]))
    rooms = {}
    for share in (8, 32, 0):
        pl, s = make(n_ctx=4096, max_middle_tokens=64), FileSession()
        pl.near = share
        pl.plan(s, BIG, cursor, "efim")
        near = pl.near_anchor(s.anchor)
        rooms[share] = len(near.prefix_tokens) if near else 0
        if near:
            assert list(near.prefix_tokens) == list(s.anchor.full_prefix[s.anchor.near_at:])
            assert len(near.suffix_tokens) <= len(near.prefix_tokens) // 3 + 1
    # A new share cuts its own near window at the next plan (the old one's start is not kept), and
    # none gives no near plan, whatever the anchor had.
    pl, s = make(n_ctx=4096, max_middle_tokens=64), FileSession()
    pl.plan(s, BIG, cursor, "efim")
    small = pl.space(P.PlannerLimits().reserve_tokens) // 32
    pl.near = 32
    assert s.anchor.near == 8 and len(pl.near_anchor(s.anchor).prefix_tokens) <= small
    pl.plan(s, BIG, cursor + len(lines[1000]), "efim")
    assert s.anchor.near == 32 and len(pl.near_anchor(s.anchor).prefix_tokens) <= small
    pl.near = 0
    assert pl.near_anchor(s.anchor) is None
    room = make(n_ctx=4096, max_middle_tokens=64).space(P.PlannerLimits().reserve_tokens)
    for share in (8, 32):  # the near window's start is aligned as a window's: one to two steps below
        assert room // share - 2 * P.window_step(room // share) <= rooms[share] <= room // share
    assert rooms[0] == 0


def test_a_line_of_indentation_alone_anchors_at_the_line_above():
    doc = "def f(x):\n    for y in x:\n        \n"
    assert P.anchor_at(doc, doc.index("        \n") + 8) == doc.index("    for")  # indentation alone
    assert P.anchor_at(doc, doc.index("        \n")) == doc.index("        \n")  # column 0: its own line
    assert P.anchor_at(doc, doc.index("for") + 3) == doc.index("    for")  # the line's own start
    assert P.anchor_at("    ", 4) == 0 and P.anchor_at("", 0) == 0  # no line above: its own start
    pl = make(MARKERS[0])  # a fragment-trained model's planner keeps the line's own start
    cur = doc.index("        \n") + 8
    assert pl.anchor_offset(doc, cur) == doc.index("    for") and replace(pl, lift_indent=False).anchor_offset(doc, cur) == cur - 8


@pytest.mark.parametrize("layout", P.LAYOUTS)
def test_closers_that_ended_the_line_when_the_anchor_was_made_are_closers_too(layout):
    """A click into ``read(|)``: the ``)`` was there when the anchor was made (it is in the plan's
    suffix); the plan names it a closer all the same, so the answer does not write it again
    (``read('a'))``); closers auto-paired since come first."""
    doc = "x = 1\ndata = read()\ny = 2\n"
    cur = doc.index("read(") + 5
    pl, s = make(), FileSession()
    assert pl.plan(s, doc, cur, layout).closers == ")"
    assert pl.plan(s, doc[:cur] + "'a" + doc[cur:], cur + 2, layout).closers == ")"  # typing on: the anchor's
    s = FileSession()
    pl.plan(s, doc, cur, layout)
    plan = pl.plan(s, doc[:cur] + "f()" + doc[cur:], cur + 2, layout)  # "f(" typed, ")" auto-paired
    assert plan.reanchor is None and plan.closers == "))"
    for text, at in [("read() + 1\n", 5), ("read(\n)\n", 5), ("f(x)\n", 4)]:  # more on the line, none, the end
        assert pl.plan(FileSession(), text, at, layout).closers == ""
    assert pl.plan(FileSession(), 'print("")  \n', 7, layout).closers == '")'  # (blanks after them)
