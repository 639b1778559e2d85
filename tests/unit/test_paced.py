"""The paced replay's typing model: human pacing, auto-pairs, debounced requests (no model)."""

import math
import statistics

from efim_local.bench import paced
from efim_local.bench.trace import Commit, load

BEFORE = "def f(x):\n    return x\n"
AFTER = "def f(x):\n    y = g(x, [1])\n    return y\n"


def test_typing_ends_on_the_commit_text_with_auto_pairs():
    st = paced.steps([Commit("f.py", "sha", "subject", BEFORE, AFTER)])
    assert st[0].kind == "open" and st[-1].doc == AFTER
    pairs = [s for s in st if s.kind == "key" and s.change and s.change[2] in ("()", "[]")]
    overs = [s for s in st if s.kind == "over"]
    assert len(pairs) == 2 and len(overs) == 2  # "(" and "[" inserted their closers, typed over later
    for s in pairs:  # the closer sits right after the cursor
        assert s.doc[s.cursor] == s.change[2][1]
    assert all(b.t > a.t for a, b in zip(st, st[1:]))


def test_pacing_defaults_and_debounce():
    st = paced.steps(load()[:3])
    keys = [b.t - a.t for a, b in zip(st, st[1:]) if b.kind == "key" and a.kind == "key" and a.change[2] != "\n"]
    assert abs(statistics.median(keys) - 0.18) < 0.02  # log-normal, median 180 ms
    jumps = [b.t - a.t for a, b in zip(st, st[1:]) if b.kind == "jump"]
    assert min(jumps) >= 2.0
    fired = paced.requests(st)
    pacing = paced.Pacing()
    for f in fired:  # a request fires only when typing paused for the debounce
        s = st[f.step]
        assert math.isclose(f.t, s.t + pacing.debounce_s) and f.next_key_t - s.t > pacing.debounce_s
        assert (f.doc, f.cursor) == (s.doc, s.cursor)
    assert len(paced.requests(st, limit=10)) == 10


def test_what_the_user_typed_next_and_a_useful_ghost():
    st = paced.steps([Commit("f.py", "sha", "subject", BEFORE, AFTER)])
    start = next(i for i, s in enumerate(st) if s.kind == "key" and s.doc.endswith("y = \n    return x\n")
                 or s.kind == "key" and s.doc[s.cursor - 4:s.cursor] == "y = ")
    typed = paced.typed_next(st, start)
    assert typed.startswith("g(x, [1])")  # the closers typed over count once, the auto-inserted ones not
    assert paced.useful("g(x, [1])\n", typed) and paced.useful("g(x, y)", typed)
    assert not paced.useful("f(x)", typed) and not paced.useful("", typed) and not paced.useful("g(", typed)
    assert paced.useful("x", "x\n") and not paced.useful("anything", "")
    # the user went on to the next line: the ghost's next line counts, its breaks and indentation alone do not
    assert paced.useful("\n    cls = Command", "\n    cls = Command\n") and paced.useful("\n    cls =", "\n    cls = C")
    assert not paced.useful("\n    cls", "\n    cls = C") and not paced.useful("\n    ", "\n    cls = C") and not paced.useful("\n  cls", "\n    cls = C")
    assert not paced.useful("\n    x = 1", "\n    cls = C") and not paced.useful("cls", "\n    cls = C")


def test_the_editor_keeps_showing_a_ghost_typed_through():
    """``displayed``: a ghost stays, shortened, while the user types its next characters; a late
    answer leaves it; a request's own text replaces it unless the ghost already shows more; any other
    key dismisses it."""
    from efim_local.bench.editors import Fired, Outcome, Step

    st = [Step(0.0, "f.py", "open", "x = ", 4),
          Step(1.0, "f.py", "key", "x = a", 5, (4, 4, "a")),
          Step(1.5, "f.py", "key", "x = ab", 6, (5, 5, "b")),
          Step(2.0, "f.py", "key", "x = abz", 7, (6, 6, "z")),
          Step(3.0, "f.py", "key", "x = abzq", 8, (7, 7, "q"))]
    fired = [Fired(1, 1.15, "f.py", "x = a", 5, 1.5), Fired(2, 1.65, "f.py", "x = ab", 6, 2.0),
             Fired(3, 2.15, "f.py", "x = abz", 7, 3.0)]
    t0 = 100.0
    outs = [Outcome(t0 + 1.15, pieces=[(t0 + 1.2, "bc"), (t0 + 1.3, "d")]),
            Outcome(t0 + 1.65, pieces=[(t0 + 1.7, "c"), (t0 + 2.1, "dd")]),  # "c": the ghost shows more
            Outcome(t0 + 2.15)]
    assert paced.displayed(st, fired, outs, t0) == ["bcd", "cd", ""]
    outs[1] = Outcome(t0 + 1.65, pieces=[(t0 + 1.7, "ce")])  # another answer replaces the ghost
    assert paced.displayed(st, fired, outs, t0)[1] == "ce"
    fired[1] = Fired(2, 1.65, "f.py", "x = ab", 6, 1.68)  # the answer came after the next key
    assert paced.displayed(st, fired, outs, t0)[1] == "cd"


def test_typing_over_a_closer_shortens_the_ghost_that_types_it():
    """``displayed``: in ``f(|)`` a ghost ``a) + 1`` (it types over the closer) stays while the user types
    ``a`` and steps over the ``)`` (an ``over`` step: the text stays, the caret moves)."""
    from efim_local.bench.editors import Fired, Outcome, Step

    st = [Step(0.0, "f.py", "open", "f()", 2),
          Step(1.0, "f.py", "key", "f(a)", 3, (2, 2, "a")),
          Step(1.5, "f.py", "over", "f(a)", 4),
          Step(2.0, "f.py", "key", "f(a)z", 5, (4, 4, "z"))]
    fired = [Fired(0, 0.15, "f.py", "f()", 2, 1.0), Fired(1, 1.15, "f.py", "f(a)", 3, 1.5),
             Fired(2, 1.65, "f.py", "f(a)", 4, 2.0)]
    t0 = 100.0
    outs = [Outcome(t0 + 0.15, pieces=[(t0 + 0.2, "a) + 1")]), Outcome(t0 + 1.15), Outcome(t0 + 1.65)]
    assert paced.displayed(st, fired, outs, t0) == ["a) + 1", ") + 1", " + 1"]


def test_stepping_over_a_closer_the_ghost_does_not_type_next_dismisses_it():
    """``displayed``: in ``f(|)`` with the ghost ``a) + 1``, the user steps over the ``)`` without typing
    ``a``: the ghost does not go on from there (its next character was not that closer)."""
    from efim_local.bench.editors import Fired, Outcome, Step

    st = [Step(0.0, "f.py", "open", "f()", 2),
          Step(1.0, "f.py", "over", "f()", 3),
          Step(2.0, "f.py", "key", "f()z", 4, (3, 3, "z"))]
    fired = [Fired(0, 0.15, "f.py", "f()", 2, 1.0), Fired(1, 1.15, "f.py", "f()", 3, 2.0)]
    t0 = 100.0
    outs = [Outcome(t0 + 0.15, pieces=[(t0 + 0.2, "a) + 1")]), Outcome(t0 + 1.15)]
    assert paced.displayed(st, fired, outs, t0) == ["a) + 1", ""]
