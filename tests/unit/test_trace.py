"""`efim bench`'s edit traces: real commits replayed as typing, a request at each word end."""

import re

from efim_local.bench import trace


def check_replay(commit: trace.Commit) -> list[trace.Request]:
    """The replay's invariants; returns its requests."""
    reqs = list(trace.requests(commit))
    for r in reqs:
        # Typing goes forward through the commit: what is before the cursor is already the new
        # file, what is after it is still the old one (changed lines are deleted, then typed).
        assert commit.after.startswith(r.text[:r.offset])
        assert commit.before.endswith(r.text[r.offset:])
        # A request fires when a word is complete: a word character before the cursor, none after.
        assert re.search(r"\w\Z", r.text[:r.offset]) and not re.match(r"\w", r.text[r.offset:])
    assert [r.offset for r in reqs] == sorted(r.offset for r in reqs)
    return reqs


def test_trace_requests_type_a_commit_at_word_ends():
    before = "def f(x):\n    return x\n\n\nprint(f(1))\n"
    after = "def f(x, y):\n    total = x + y\n    return total\n\n\nprint(f(1, 2))\n"
    reqs = check_replay(trace.Commit("a.py", "0", "s", before, after))
    # One request per word typed in the changed lines, in typing order; the unchanged lines are not typed.
    words = [re.search(r"\w+\Z", r.text[:r.offset]).group() for r in reqs]
    assert words == ["def", "f", "x", "y", "total", "x", "y", "return", "total", "print", "f", "1", "2"]
    # While the first block is typed, the rest of the old file follows the cursor.
    assert reqs[4].text == "def f(x, y):\n    total\n\nprint(f(1))\n" and reqs[4].offset == len("def f(x, y):\n    total")
    assert reqs[-1].text == after[:-len("))\n")] and reqs[-1].offset == len(reqs[-1].text)


def test_trace_without_changes_has_no_requests():
    text = "x = 1\n"
    assert list(trace.requests(trace.Commit("a.py", "0", "s", text, text))) == []
    # A pure deletion types nothing either.
    assert list(trace.requests(trace.Commit("a.py", "0", "s", text + "y = 2\n", text))) == []


def test_shipped_trace_is_real_commits():
    commits = trace.load()
    assert len(commits) >= 3 and all(len(c.sha) == 12 and c.before != c.after for c in commits)
    assert sum(len(check_replay(c)) for c in commits[:2]) >= 50
