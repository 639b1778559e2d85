"""The simulated user of the paced replay (bench/user.py): which suggestions they accept."""

from efim_local.bench import paced
from efim_local.bench.trace import Commit
from efim_local.bench.user import Ghost, accept_match, forms


def test_forms_longest_first():
    assert forms("foo(x)\n    bar()") == [("full", "foo(x)\n    bar()"), ("line", "foo(x)"), ("word", "foo")]
    assert forms("  total") == [("full", "  total")]
    assert forms("") == []


def typed(before: str, after: str):
    return paced.steps([Commit("a.py", "0", "", before, after)])


def test_a_suggestion_is_accepted_when_typing_on_reaches_the_same_document():
    before = "def f(a):\n    pass\n"
    after = "def f(a):\n    x = g(a)\n    pass\n"
    steps = typed(before, after)
    i = next(k for k, s in enumerate(steps) if s.kind == "key")  # the first keystroke
    at = steps[i - 1]
    # auto-pairs: typing "g(" inserts "g()", then ")" is typed over; accepting inserts "x = g(a)"
    hit = accept_match(steps, i, Ghost(at.doc, at.cursor, "    x = g(a)\n    return a"))
    assert hit is not None and hit[1:] == ("line", "    x = g(a)")
    assert steps[hit[0]].doc == at.doc[:at.cursor] + "    x = g(a)" + at.doc[at.cursor:]
    assert accept_match(steps, i, Ghost(at.doc, at.cursor, "    y = 1")) is None  # not what they type
    word = accept_match(steps, i, Ghost(at.doc, at.cursor, "    x.append(1)"))
    assert word is not None and word[1:] == ("word", "    x")


def test_a_suggestion_that_types_over_a_closer_is_taken_in_its_place():
    """In ``g(|)`` (auto-pairs), the ghost ``a)`` replaces the closer (``replaces`` 1): accepting it gives
    the document the user reaches by typing ``a`` and over ``)``; without ``replaces`` all of it would
    give ``g(a))``, which they never reach."""
    before = "def f(a):\n    x = g\n    pass\n"
    after = "def f(a):\n    x = g(a)\n    pass\n"
    steps = typed(before, after)
    i = next(k for k, s in enumerate(steps) if s.kind == "key" and s.doc.count("(") == 2)  # after "(" and its ")"
    at = steps[i]
    assert at.doc[at.cursor:at.cursor + 1] == ")"
    hit = accept_match(steps, i + 1, Ghost(at.doc, at.cursor, "a)", replaces=1))
    assert hit is not None and hit[1:] == ("full", "a)") and steps[hit[0]].kind == "over"  # the ")" typed over
    assert steps[hit[0]].doc == at.doc[:at.cursor] + "a)" + at.doc[at.cursor + 1:]
    assert accept_match(steps, i + 1, Ghost(at.doc, at.cursor, "a)"))[1] == "word"  # only "a" is reached
