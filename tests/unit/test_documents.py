"""Editor-synced documents (didOpen / didChange / didClose) applied to the engine's per-file state."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from efim_local.daemon import documents as D
from efim_local.daemon.documents import Documents
from efim_local.engine.files import Files
from efim_local.errors import InvalidParams


def pos(line, character):
    return {"line": line, "character": character}


def rng(l0, c0, l1, c1):
    return {"start": pos(l0, c0), "end": pos(l1, c1)}


def lsp_position(text: str, offset: int) -> dict:
    """The LSP position of an offset: 0-based line, character in code points."""
    line = text.count("\n", 0, offset)
    return pos(line, offset - (text.rfind("\n", 0, offset) + 1))


@pytest.fixture
def docs():
    return Documents(Files())


def opened(docs, text, path="a.py", version=1):
    docs.open({"path": path, "text": text, "version": version})
    return path


def change(docs, path, *changes, **extra):
    return docs.change({"path": path, "contentChanges": list(changes), **extra})


# -- open, get, close -----------------------------------------------------------------------------
def test_open_stores_the_text_in_the_engines_file_state(docs):
    f = docs.open({"path": "a.py", "text": "x = 1\n", "version": 4})
    assert (f.text, f.version, f.open) == ("x = 1\n", 4, True)
    assert docs.files.get("a.py") is f and docs.text("a.py") == "x = 1\n"
    assert docs.open({"path": "b.py", "text": ""}).version == 0  # version is optional


def test_closed_and_unknown_documents_are_not_open(docs):
    opened(docs, "x")
    docs.close({"path": "a.py"})
    docs.close({"path": "never-opened.py"})  # closing twice or unknown: nothing to do
    for path in ("a.py", "never-opened.py"):
        with pytest.raises(InvalidParams, match="document not open"):
            docs.text(path)
        with pytest.raises(InvalidParams, match="document not open"):
            change(docs, path, {"text": "y"})


@pytest.mark.parametrize("params,message", [
    ({"text": "x"}, "'path' is required"),
    ({"path": 3, "text": "x"}, "'path' must be str"),
    ({"path": "p" * (D.MAX_PATH + 1), "text": "x"}, "'path' is too long"),
    ({"path": "a.py"}, "'text' is required"),
    ({"path": "a.py", "text": 5}, "'text' must be str"),
    ({"path": "a.py", "text": "x", "version": -1}, "'version' must be in"),
    ({"path": "a.py", "text": "x", "version": "2"}, "'version' must be int"),
])
def test_open_validates_its_params(docs, params, message):
    with pytest.raises(InvalidParams, match=message):
        docs.open(params)
    assert docs.files.get("a.py") is None


def test_open_documents_are_limited(docs):
    docs = Documents(Files(), limit=2)
    opened(docs, "1", "a.py")
    opened(docs, "2", "b.py")
    opened(docs, "2b", "b.py")  # reopening an open document is not one more
    with pytest.raises(InvalidParams, match="more than 2 open documents"):
        opened(docs, "3", "c.py")
    docs.close({"path": "a.py"})
    opened(docs, "3", "c.py")
    assert docs.files.n_open() == 2


def test_documents_larger_than_the_limit_are_refused(docs, monkeypatch):
    monkeypatch.setattr(D, "MAX_DOCUMENT_BYTES", 10)
    with pytest.raises(InvalidParams, match="document larger than"):
        opened(docs, "x" * 11)
    opened(docs, "x" * 10)
    with pytest.raises(InvalidParams, match="document larger than"):
        change(docs, "a.py", {"range": rng(0, 0, 0, 0), "text": "y"})
    assert docs.files.get("a.py").text == "x" * 10  # all changes or none


@pytest.mark.parametrize("refused", [
    {"method": "change", "text": "x" * 11},  # over the limit
    {"method": "change", "text": "x\ud800"},  # a lone surrogate
    {"method": "change", "range": rng(5, 0, 5, 0)},  # outside the text
    {"method": "open", "text": "x" * 11},
    {"method": "open", "text": "\udc80"},
])
def test_a_refused_edit_puts_the_document_out_of_step_until_reopened(docs, monkeypatch, refused):
    """Issue 27 item 9: the daemon's copy is no longer the editor's: its completions, cursor and
    later incremental edits are refused (with the first reason) until a didOpen brings the text."""
    monkeypatch.setattr(D, "MAX_DOCUMENT_BYTES", 10)
    opened(docs, "abc", version=1)
    with pytest.raises(InvalidParams) as first:
        if refused["method"] == "open":
            docs.open({"path": "a.py", "text": refused["text"], "version": 2})
        else:
            ch = {"text": refused.get("text", "y")}
            if "range" in refused:
                ch["range"] = refused["range"]
            change(docs, "a.py", ch, version=2)
    reason = first.value.message.removeprefix("invalid params: ")
    for call in (lambda: docs.text("a.py"), lambda: change(docs, "a.py", {"range": rng(0, 0, 0, 0), "text": "z"})):
        with pytest.raises(InvalidParams, match="out of step") as e:
            call()
        assert reason in e.value.message
    opened(docs, "fresh", version=3)
    assert docs.text("a.py", version=3) == "fresh"
    with pytest.raises(InvalidParams, match="too many content changes"):
        change(docs, "a.py", *[{"text": "q"}] * (D.MAX_CHANGES + 1))
    with pytest.raises(InvalidParams, match="out of step"):
        docs.text("a.py")
    docs.close({"path": "a.py"})
    opened(docs, "abc")
    assert docs.text("a.py") == "abc"  # closing forgets the refusal


def test_a_refused_open_of_a_new_document_opens_nothing(docs):
    with pytest.raises(InvalidParams, match="surrogate"):
        docs.open({"path": "n.py", "text": "\ud800"})
    with pytest.raises(InvalidParams, match="document not open"):
        docs.text("n.py")
    assert docs.refused == {}


def test_text_checks_the_version_the_caller_expects(docs):
    opened(docs, "abc", version=4)
    assert docs.text("a.py", version=4) == "abc"
    with pytest.raises(InvalidParams, match="the daemon has version 4 of a.py, not 5"):
        docs.text("a.py", version=5)


def test_files_forget_closed_documents_first_and_never_open_ones():
    files = Files(limit=3)
    docs = Documents(files, limit=3)
    for p in ("a.py", "b.py", "c.py"):
        opened(docs, p, p)
    docs.close({"path": "a.py"})
    files.entry("d.py")  # one entry too many: the oldest closed file is forgotten
    assert files.get("a.py") is None and files.n_open() == 2 and files.get("d.py") is not None
    files.entry("b.py")  # used again: now the most recent
    files.entry("e.py")
    assert files.get("d.py") is None and [files.get(p).open for p in ("b.py", "c.py")] == [True, True]


# -- incremental changes ------------------------------------------------------------------------------
def test_incremental_changes_apply_in_order(docs):
    path = opened(docs, "def f(x):\n    return x\n")
    f = change(docs, path,
               {"range": rng(0, 7, 0, 7), "text": ", y"},  # insert
               {"range": rng(1, 11, 1, 12), "text": "x + y"},  # replace, on the text after the first change
               {"range": rng(1, 4, 1, 4), "text": "z = 1\n    "})  # insert a line
    assert f.text == "def f(x, y):\n    z = 1\n    return x + y\n" and f.version == 2
    change(docs, path, {"range": rng(1, 0, 2, 0), "text": ""}, version=10)  # delete a whole line
    assert docs.text(path) == "def f(x, y):\n    return x + y\n" and docs.files.get(path).version == 10
    change(docs, path, {"text": "whole new text"})  # no range: the full text
    assert docs.text(path) == "whole new text"


def test_characters_are_code_points(docs):
    path = opened(docs, "s = '日本🙂'\nx\n")
    change(docs, path, {"range": rng(0, 7, 0, 8), "text": "🙃"})  # the emoji is one character
    assert docs.text(path) == "s = '日本🙃'\nx\n"


def test_crlf_line_ends(docs):
    path = opened(docs, "ab\r\ncd\r\n")
    change(docs, path, {"range": rng(0, 2, 0, 2), "text": "X"})  # the end of line 0 is before its CR
    assert docs.text(path) == "abX\r\ncd\r\n"
    change(docs, path, {"range": rng(0, 3, 1, 0), "text": ""})  # join the lines: CR and LF go together
    assert docs.text(path) == "abXcd\r\n"
    with pytest.raises(InvalidParams, match="past the end of line 1"):
        change(docs, path, {"range": rng(0, 6, 0, 6), "text": "?"})  # between CR and LF is not a position
    assert docs.files.get(path).text == "abXcd\r\n"


@pytest.mark.parametrize("ch,message", [
    ({"range": rng(5, 0, 5, 0), "text": "x"}, "past the end of the document"),
    ({"range": rng(0, 7, 0, 7), "text": "x"}, "past the end of line 1"),  # "ok abc" after the first
    ({"range": rng(1, 0, 1, 9), "text": "x"}, "past the end of line 2"),
    ({"range": rng(1, 1, 0, 1), "text": "x"}, "range end before start"),
    ({"range": rng(0, 2, 0, 1), "text": "x"}, "range end before start"),
    ({"range": rng(-1, 0, 0, 0), "text": "x"}, "'line' must be in"),
    ({"range": {"start": pos(0, 0)}, "text": "x"}, "'end' is required"),
    ({"range": {"start": pos(0, 0), "end": {"line": 0}}, "text": "x"}, "'character' is required"),
    ({"range": {"start": pos(0, 0), "end": pos(0, True)}, "text": "x"}, "'character' must be int"),
    ({"range": [0, 0], "text": "x"}, "'range' must be dict"),
    ({"range": rng(0, 0, 0, 0)}, "'text' is required"),
    ("x", "a content change must be an object"),
])
def test_bad_changes_are_refused_and_change_nothing(docs, ch, message):
    path = opened(docs, "abc\ndef\n")
    with pytest.raises(InvalidParams, match=message):
        change(docs, path, {"range": rng(0, 0, 0, 0), "text": "ok "}, ch)  # a good change, then the bad one
    f = docs.files.get(path)
    assert (f.text, f.version) == ("abc\ndef\n", 1)  # all changes or none


def test_change_params(docs):
    for params, message in [({}, "'contentChanges' is required"),
                             ({"contentChanges": {"text": "y"}}, "'contentChanges' must be list"),
                             ({"contentChanges": [{"text": "y"}] * (D.MAX_CHANGES + 1)}, "too many content changes")]:
        path = opened(docs, "x")  # reopened: each refusal puts it out of step
        with pytest.raises(InvalidParams, match=message):
            docs.change({"path": path, **params})
        assert docs.files.get(path).text == "x"


def test_a_bad_version_changes_nothing(docs):
    path = opened(docs, "abc")
    with pytest.raises(InvalidParams):
        change(docs, path, {"range": rng(0, 0, 0, 0), "text": "x"}, version=-1)
    assert docs.files.get(path).text == "abc"


EDITS = st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 20), st.text("ab\n\r\té日🙂", max_size=6)),
                 min_size=1, max_size=6)


@given(text=st.text("ab \n\r\té日🙂", max_size=40), edits=EDITS)
def test_incremental_changes_equal_splicing_the_text(text, edits):
    """Any sequence of LSP range edits gives the text that splicing the strings gives."""
    docs = Documents(Files())
    path = opened(docs, text)
    want, changes = text, []
    for at, n, new in edits:
        # Positions are offsets on a line; an offset between a CR and its LF is not one.
        ok = [i for i in range(len(want) + 1) if not (0 < i < len(want) and want[i - 1] == "\r" and want[i] == "\n")]
        start = ok[at % len(ok)]
        end = next((i for i in ok if i >= min(start + n, len(want))), start)
        changes.append({"range": {"start": lsp_position(want, start), "end": lsp_position(want, end)}, "text": new})
        want = want[:start] + new + want[end:]
    f = change(docs, path, *changes)
    assert f.text == want and f.version == 2


# -- positions --------------------------------------------------------------------------------------
def test_position_to_offset():
    text = "ab\ncd\r\n\nü"
    assert [D.position({"p": pos(line, c)}, "p", text) for line, c in ((0, 0), (0, 2), (1, 2), (2, 0), (3, 1))] == \
        [0, 2, 5, 7, 9]
    with pytest.raises(InvalidParams, match="past the end of the document"):
        D.position({"p": pos(4, 0)}, "p", text)
    with pytest.raises(InvalidParams, match="'p' is required"):
        D.position({}, "p", text)


# -- issue 17: the UTF-8 limit, bad names, the line index, the lock, bounded reads ---------------------
def test_the_document_limit_counts_utf8_bytes(docs, monkeypatch):
    monkeypatch.setattr(D, "MAX_DOCUMENT_BYTES", 12)
    opened(docs, "é" * 6)  # 12 bytes
    with pytest.raises(InvalidParams, match="document larger than"):
        opened(docs, "\U0001F600" * 4, "b.py")  # 4 code points, 16 bytes
    with pytest.raises(InvalidParams, match="document larger than"):
        change(docs, "a.py", {"range": rng(0, 0, 0, 0), "text": "e"})
    assert docs.files.get("a.py").text == "é" * 6


@pytest.mark.parametrize("params,message", [
    ({"path": "a\ud800.py", "text": "x"}, "'path' contains a lone surrogate"),
    ({"path": "a\0.py", "text": "x"}, "'path' contains a NUL"),
    ({"path": "a.py", "text": "x\udfff"}, "lone surrogate at offset 1"),
])
def test_names_and_texts_that_cannot_be_encoded_are_refused(docs, params, message):
    with pytest.raises(InvalidParams, match=message):
        docs.open(params)
    assert docs.files.get("a.py") is None


EDITS = st.lists(st.tuples(st.integers(0, 200), st.integers(0, 200), st.text("ab\n\r\U0001F600", max_size=6)),
                 max_size=8)


@given(text=st.text("ab\n\r\U0001F600", max_size=60), edits=EDITS)
def test_a_batch_through_the_line_index_equals_edits_one_by_one(text, edits):
    """apply_changes (one line index for the batch) == each edit located by offset_of on the text so far."""
    expected, changes = text, []
    for a, b, new in edits:
        a, b = sorted((a % (len(expected) + 1), b % (len(expected) + 1)))
        start, end = lsp_position(expected, a), lsp_position(expected, b)
        try:  # a position inside a CRLF is not addressable; skip such edits
            if D.offset_of(expected, **start) != a or D.offset_of(expected, **end) != b:
                continue
        except Exception:  # noqa: BLE001
            continue
        changes.append({"range": {"start": start, "end": end}, "text": new})
        expected = expected[:a] + new + expected[b:]
    assert D.apply_changes(text, changes)[0] == expected


def test_a_batch_of_changes_is_applied_outside_the_global_lock(docs, monkeypatch):
    """While one document's edits are applied, other threads can take the engine's file lock."""
    import threading

    path = opened(docs, "x\n" * 10)
    free = []
    real = D.LineIndex.offset

    def offset(self, line, character):
        t = threading.Thread(target=lambda: free.append(docs.files.lock.acquire(timeout=2) and
                                                        (docs.files.lock.release() or True)))
        t.start()
        t.join()
        return real(self, line, character)

    monkeypatch.setattr(D.LineIndex, "offset", offset)
    change(docs, path, {"range": rng(5, 0, 5, 1), "text": "y"})
    assert free and all(free) and docs.text(path).splitlines()[5] == "y"


def test_the_work_of_one_did_change_is_bounded(docs, monkeypatch):
    monkeypatch.setattr(D, "MAX_CHANGE_WORK", 100)
    path = opened(docs, "x" * 40)
    edit = {"range": rng(0, 0, 0, 1), "text": "y"}
    change(docs, path, edit, edit)  # 80 code points copied
    with pytest.raises(InvalidParams, match="too much text"):
        change(docs, path, edit, edit, edit)
    assert docs.files.get(path).version == 2  # the refused batch changed nothing


def test_offset_of_far_lines_agrees_with_the_line_loop():
    from efim_local.prompt import document

    text = "ab\r\n" * 3000 + "tail"
    for line, ch in [(0, 0), (1500, 2), (2999, 1), (3000, 4)]:
        assert document.offset_of(text, line, ch) == 4 * line + ch
    for line, ch in [(2999, 3), (3001, 0), (3000, 5)]:
        with pytest.raises(document.DocumentError):
            document.offset_of(text, line, ch)


@pytest.mark.parametrize("kind", ["fifo", "device", "link", "dir", "big"])
def test_read_source_reads_only_bounded_regular_files(tmp_path, kind, monkeypatch):
    import os

    from efim_local.errors import DocumentError
    from efim_local.prompt import document

    monkeypatch.setattr(document, "MAX_DOCUMENT_BYTES", 100)
    (tmp_path / "real.py").write_text("x = 1\n")
    path = {"fifo": tmp_path / "f", "device": "/dev/zero", "link": tmp_path / "l.py", "dir": tmp_path,
            "big": tmp_path / "big.py"}[kind]
    if kind == "fifo":
        os.mkfifo(path)  # opening it must not wait for a writer
    elif kind == "link":
        path.symlink_to(tmp_path / "real.py")
        assert document.read_source(path) == "x = 1\n"  # followed when asked to
    elif kind == "big":
        path.write_text("x" * 101)
    message = {"fifo": "not a regular file", "device": "not a regular file", "link": "is a symbolic link",
               "dir": "is a directory", "big": "larger than"}[kind]
    with pytest.raises(DocumentError, match=message):
        document.read_source(path, follow=False)


@pytest.mark.parametrize("old, new, caret", [
    ("", "v", 1),  # typed: after it
    ("ret\n", "retv\n", 4),  # Neovim sends the whole line: after the v, not on the next line
    ("a\nb\nc\n", "a\nbx\nc\n", 4),  # whole lines around the edited one
    ("retv\n", "ret\n", 3),  # a deletion
    ("ret\n", "ret\n\n", 4),  # Enter at the line's end: the new line's start
    (")", "foo)", 4),  # an accept that typed over the closer: after it (no line kept)
    ("", "()", 1),  # an auto-paired opener: between the two
])
def test_the_caret_an_edit_leaves_is_where_typing_left_it(old, new, caret):
    """Where the answer begun at a keystroke is planned (FollowUp.typed): a caret past the typed text
    anchored that plan after the cursor, and the request after it re-anchored (cursor_before_anchor)
    and computed again, where it would have typed through the answer (test_nvim, now and then)."""
    text = "x = 1\n" + old + "end\n"
    start = {"line": 1, "character": 0}
    lines = old.split("\n")
    end = {"line": 1 + len(lines) - 1, "character": len(lines[-1])}
    out, got = D.apply_changes(text, [{"range": {"start": start, "end": end}, "text": new}])
    assert out == "x = 1\n" + new + "end\n" and got == 6 + caret
