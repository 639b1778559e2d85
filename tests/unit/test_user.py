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
