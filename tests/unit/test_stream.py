"""Generated token bytes to text: partial UTF-8, stop strings, newline and line limits."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from efim_local.engine.stream import StopRules, TextStream, typed_over
from efim_local.prompt.templates import text_stops


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


def chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    bounds = sorted({c % (len(data) + 1) for c in cuts})
    return [data[i:j] for i, j in zip([0, *bounds], [*bounds, len(data)])]


@given(text=st.text(st.sampled_from(list("ab <END>\n") + ["日", "é", "🙂"]), max_size=40),
       cuts=st.lists(st.integers(0, 200), max_size=12))
def test_any_byte_chunking_stops_at_the_first_stop_string(text, cuts):
    """However the bytes are split into tokens, the text shown is the text before the first stop string."""
    s = TextStream(StopRules(stop_strings=("<END>",)))
    out = "".join(s.feed(c) for c in chunked(text.encode(), cuts))
    want = text.split("<END>")[0]
    if "<END>" in text:
        assert s.stop_reason == "stop_string" and out == s.text == want
    else:
        out += s.finish()
        assert s.stop_reason is None and out == s.text == without_marker_tail(want, ("<END>",))


def without_marker_tail(text: str, stops) -> str:
    """``text`` less a tail of 2+ characters that begins a stop string (a marker cut short)."""
    for k in range(len(text), 1, -1):
        if any(len(s) > k and s.startswith(text[-k:]) for s in stops):
            return text[:-k]
    return text


def test_a_marker_cut_short_at_the_end_is_never_shown():
    """Before: a stream that ended inside a marker ("</MI" at max_tokens) showed it."""
    stops = text_stops(("<PRE>", "<SUF>", "<MID>"))
    for data, want in [(b"x = 1</MI", "x = 1"), (b"y = f(2)</MID> junk", "y = f(2)"), (b"z <END> more", "z "),
                       (b"w = a <", "w = a <"), (b"v = 3 <EO", "v = 3 ")]:
        assert shown(StopRules(stop_strings=stops), [data[:3], data[3:]])[0] == want, data


def shown(rules: StopRules, chunks: list[bytes]) -> tuple[str, str | None]:
    """What a client is shown, as the engine streams it, and the stop reason."""
    s = TextStream(rules)
    out = "".join(s.feed(c) for c in chunks)
    if s.stop_reason is None:
        out += s.finish()
    assert out == s.text
    return out, s.stop_reason


RULES = [StopRules(stop_at_newline=True), StopRules(max_lines=1), StopRules(max_lines=2),
         StopRules(max_lines=3, stop_strings=("<END>", "\n\n\n")), StopRules(closers=")]"),
         StopRules(closers='"', stop_at_newline=True), StopRules(closers=")]", type_over=True),
         StopRules(closers='")', type_over=True, max_lines=2), StopRules(closers="})", type_over=True),
         StopRules(closers="]"), StopRules(closers="`"), StopRules(closers="'`]", type_over=True)]


# Every character the closers use (windows.CLOSERS) and their openers, quotes and escapes among them.
@given(text=st.text(st.sampled_from(list("ab \t\r\n<END>()[]{}'\"`\\") + ["日", "🙂"]), max_size=40),
       cuts=st.lists(st.integers(0, 200), max_size=12), rules=st.sampled_from(RULES))
def test_what_is_shown_does_not_depend_on_token_boundaries(text, cuts, rules):
    out, reason = shown(rules, chunked(text.encode(), cuts))
    assert (out, reason) == shown(rules, [text.encode()])
    assert text.startswith(out)
    if reason is None:  # no rule fired: everything is shown, but a marker cut short at the end
        assert out == without_marker_tail(text, rules.stop_strings)
    elif reason in ("newline", "max_lines"):
        assert text[len(out)] == "\n"  # cut at the end of a line
        n = rules.max_lines or 1
        assert out.lstrip().count("\n") == n - 1  # leading blank lines do not count
    elif reason == "closer" and rules.type_over:  # typed over some of the closers, not all: cut at its line's end
        assert text[len(out)] == "\n" and 0 < typed_over(out, rules.closers)[0] < len(rules.closers)
    elif reason == "closer":
        assert text[len(out)] == rules.closers[0]
    else:
        assert any(text[len(out):].startswith(stop) for stop in rules.stop_strings)


def test_blank_first_lines_are_skipped_however_they_are_streamed():
    rules = StopRules(stop_at_newline=True)
    assert shown(rules, [b"  ", b"\n", b"  foo\n"]) == shown(rules, [b"  \n  foo\n"]) == ("  \n  foo", "newline")


@pytest.mark.parametrize("rules,data", [(StopRules(stop_strings=("<END>",)), b"ab<END>\xe6"),
                                        (StopRules(stop_at_newline=True), b"foo\n\xe6")])
def test_finish_after_a_stop_adds_nothing(rules, data):
    s = TextStream(rules)
    out = s.feed(data)
    assert s.stop_reason is not None
    assert s.finish() == "" and s.text == out


@pytest.mark.parametrize("closer, text, shown_", [
    (")", "a, b), c", "a, b"),                   # the call the editor already closed
    (")", "f(x), g[1]) + 1", "f(x), g[1]"),     # nested pairs are the model's own
    (")", "a]\nb) c", "a]\nb"),                  # a stray closer of another kind is not the one
    ("]", "0][1]", "0"),
    ('"', 'say \\"hi\\"" + x', 'say \\"hi\\"'),  # an escaped quote does not end the string
    (")", "no closer here", "no closer here"),
    (")", "'a)b') + 1", "'a)b'"),                # a string the answer opens hides its brackets
    (")", "x: &'a str) -> u8", "x: &'a str"),    # an apostrophe that opens none: a Rust lifetime,
    (")", "it's) + 1", "it's"),                  # in a word,
    (")", "f'{x})') + 1", "f'{x})'"),            # (but a Python string prefix opens one)
    (")", '"(", x) + 1', '"(", x'),
    (")", "'open\nx) + 1", "'open\nx"),          # a quote left open ends with its line
    ("}", "a: {'b': '}'}} rest", "a: {'b': '}'}"),
])
def test_an_answer_stops_where_it_would_close_an_auto_paired_closer(closer, text, shown_):
    out, reason = shown(StopRules(closers=closer), [text.encode()])
    assert out == shown_ and reason == ("closer" if out != text else None)


@pytest.mark.parametrize("closers, text, shown_, replaces", [
    (")", "est)", "est)", 1),                         # f(|) -> f(est)
    (")", "est) + 1\nnext", "est) + 1\nnext", 1),     # all typed over: what follows is the suffix the model saw
    ("))", "x), y)\nz", "x), y)\nz", 2),              # print(f(|)) -> print(f(x), y)
    ("))", "x), y\nz", "x), y", 1),                   # one of two: its line ends the answer (z would sit inside)
    ('")', 'abc", 1)', 'abc", 1)', 2),
    (")", "no closer here", "no closer here", 0),
    (")", "'a)b')\nnext", "'a)b')\nnext", 1),        # f(|) -> f('a)b'): the ) in the string is text
    ("))", "'x)'), y\nz", "'x)'), y", 1),
])
def test_an_answer_that_types_over_closers_goes_on_past_them(closers, text, shown_, replaces):
    rules = StopRules(closers=closers, type_over=True)
    out, reason = shown(rules, [text.encode()])
    assert out == shown_ and rules.replaced(out) == replaces
    assert reason == ("closer" if out != text else None)
    assert StopRules(closers=closers).replaced(out) == 0  # without type_over nothing is replaced


@pytest.mark.parametrize("closers, text, want", [
    ("))", "x), y\nz)", (2, 8)),      # a line end between them does not stop the count (the stream's cut does)
    (")])", "a)\nb]c)", (3, 7)),
    (")", "`a)b`) + 1", (1, 6)),      # brackets in a string the text opens are text, whatever its quote
    (")", '"a\\")b") + 1', (1, 8)),   # (an escaped quote does not close that string)
    ("'", "it) + 'x", (1, 7)),        # the cursor's own string: its quote ends it, brackets or not
    (")]", "x]) y", (1, 3)),          # in order: a ] before the ) is the text's own
])
def test_typed_over_counts_the_closers_a_text_types_over_in_order(closers, text, want):
    """``typed_over`` is a function of any text, not only an answer the stream already cut: the count
    the Neovim plugin's mirror of it (efim/closers.lua) also gives."""
    assert typed_over(text, closers) == want


def test_where_an_answer_typing_over_closers_ends_does_not_depend_on_its_tokens():
    """(Review: the cut was undone when a later chunk typed over the next closer.)"""
    rules = StopRules(closers='")', type_over=True)
    assert shown(rules, [b'"\n', b")"]) == shown(rules, [b'"\n)']) == ('"', "closer")


def answer(rules: StopRules, pieces: list[bytes]) -> tuple[str, str | None]:
    s = TextStream(rules)
    out = "".join(s.feed(p) for p in pieces)
    out += s.finish()
    assert out == s.text  # what was shown is the answer: nothing shown was taken back
    return out, s.stop_reason


def test_an_answer_ends_where_it_leaves_its_block_or_repeats_the_lines_above():
    body = StopRules(max_tokens=64, line="    return sum(xs) / ", above=("def mean(xs):",))
    # a new top-level function after the middle (an Instruct model running on)
    assert answer(body, [b"len(xs)", b"\n\n", b"\n", b"def", b" median(xs):\n"]) == ("len(xs)", "block")
    # a Markdown fence, and a line dedented below the block
    assert answer(body, [b"len(xs)\n", b"```", b"\n"]) == ("len(xs)", "block")
    loop = StopRules(max_tokens=64, line="        ", above=("for x in xs:",))
    assert answer(loop, [b"total += x\n", b"        n += 1\n", b"    return total / n\n"]) == \
        ("total += x\n        n += 1", "block")
    # a line that repeats one of the lines just above the cursor
    rep = StopRules(max_tokens=64, line="    ", above=("total = 0", "for x in xs:"))
    assert answer(rep, [b"total += x\n", b"    for x in", b" xs:\n", b"        pass"]) == ("total += x", "repeat")
    # nothing to cut: the block goes on, and the lines end where the model ends
    assert answer(loop, [b"total += x\n", b"        n += 1"]) == ("total += x\n        n += 1", None)
    top = StopRules(max_tokens=64, line="", above=())
    assert answer(top, [b"import os\n", b"import sys\n"]) == ("import os\nimport sys\n", None)
    assert answer(top, [b"import os\n", b"\n", b"def main():\n"]) == ("import os", "block")


def test_blank_lines_and_indentation_wait_for_the_line_they_start():
    s = TextStream(StopRules(max_tokens=64, line="    x = ", above=()))
    assert s.feed(b"1\n") == "1" and s.feed(b"    ") == "" and s.feed(b"y = 2") == "\n    y = 2"
