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


def test_traces_from_releases(tmp_path):
    """Consecutive releases of a project make a trace: one change per changed file, release by
    release, kept when the file's size and the typed change fall within the limits."""
    small, big = "x = 1\n", "def f(x):\n    return x\n" * 40
    files = {"0.1": {"a.py": big, "b.py": small, "c.py": big},
             "0.2": {"a.py": big.replace("return x", "return x + 1", 3), "b.py": small + "y = 2\n", "c.py": big},
             "0.3": {"a.py": big, "b.py": small, "c.py": big + "z = 3\n" * 5}}
    releases = []
    for v, content in files.items():
        for name, text in content.items():
            (tmp_path / v / "pkg").mkdir(parents=True, exist_ok=True)
            (tmp_path / v / "pkg" / name).write_text(text)
        releases.append((v, tmp_path / v))
    names = ["pkg/a.py", "pkg/b.py", "pkg/c.py", "pkg/missing.py"]
    commits = trace.from_releases(releases, names, trace.Limits(min_bytes=100, min_typed=10))
    # b.py is too small; c.py did not change from 0.1 to 0.2; release order comes first.
    assert [(c.file, c.sha) for c in commits] == [("pkg/a.py", "0.1..0.2"), ("pkg/a.py", "0.2..0.3"),
                                                  ("pkg/c.py", "0.2..0.3")]
    assert commits[0].before == big and commits[0].after == files["0.2"]["a.py"]
    for c in commits:  # typing goes forward through each change
        assert all(c.after.startswith(r.text[:r.offset]) and c.before.endswith(r.text[r.offset:])
                   for r in trace.requests(c))
    few = trace.from_releases(releases, names, trace.Limits(min_bytes=100, min_typed=10, max_typed=50))
    assert [c.sha for c in few] == ["0.2..0.3"]  # the 3-line change types more than 50 characters
    assert trace.typed_chars("a\nb\n", "a\nbc\nd\n") == len("bc\nd\n")


def test_shipped_traces_by_name(tmp_path):
    import pytest

    assert trace.resolve(None) == trace.resolve("efim") == trace.DEFAULT_TRACE
    click = trace.load(trace.resolve("click"))
    # Another project's files, most bigger than a 4096-token slot (about 3.5 bytes per token).
    assert len(click) >= 10 and len({c.file for c in click}) >= 5
    assert sum(len(c.before) > 4096 * 3.5 for c in click) >= len(click) // 2
    assert (trace.DATA / "click-trace.LICENSE.txt").read_text().startswith("The click edit trace")
    assert sum(len(check_replay(c)) for c in click[:2]) >= 50
    with pytest.raises(ValueError, match="no trace"):
        trace.resolve(tmp_path / "nope.json.gz")
