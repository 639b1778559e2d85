"""The LSP server's document copy: position units (UTF-16/8/32 <-> code points) and edits."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from efim_local.errors import InvalidParams
from efim_local.lsp.text import Converter, Doc, columns

TEXT = st.text(st.sampled_from("ab \t\n\ré😀_("), max_size=40)


def units(s: str, enc: str) -> int:
    return {"utf-16": len(s.encode("utf-16-le")) // 2, "utf-8": len(s.encode()), "utf-32": len(s)}[enc]


@pytest.mark.parametrize("enc", ["utf-16", "utf-8", "utf-32"])
def test_units_round_trip(enc):
    conv = Converter(enc)
    line = "x = 'αβ 😀 ok'"
    for cp in range(len(line) + 1):
        u = units(line[:cp], enc)
        assert conv.to_units(line, cp) == u and conv.to_points(line, u) == cp
    assert conv.to_points(line, 10_000) == len(line)  # past the end: the end (LSP)


def test_half_a_surrogate_pair_is_an_error():
    with pytest.raises(InvalidParams, match="splits a character"):
        Converter("utf-16").to_points("a😀b", 2)


def test_line_past_the_end_is_an_error_and_crlf_cr_is_not_a_column():
    doc = Doc("ab\r\ncd")
    conv = Converter()
    assert doc.point(0, 99, conv) == (0, 2) and columns(doc.lines[0]) == "ab"
    with pytest.raises(InvalidParams, match="outside the document"):
        doc.point(2, 0, conv)


@given(TEXT, st.lists(st.tuples(st.integers(0, 60), st.integers(0, 60), TEXT), max_size=6))
def test_edits_match_string_splicing(text, edits):
    """Edits given as LSP ranges (UTF-16) leave the same text as splicing the string by offsets."""
    doc, conv = Doc(text), Converter("utf-16")
    for a, b, new in edits:
        a, b = sorted((a % (len(text) + 1), b % (len(text) + 1)))
        # offsets -> (line, UTF-16 column); skip offsets inside a CRLF's "\r\n" (not a column)
        if any(0 < o <= len(text) and text[o - 1] == "\r" and text[o:o + 1] == "\n" for o in (a, b)):
            continue
        pos = []
        for o in (a, b):
            line = text.count("\n", 0, o)
            start = text.rfind("\n", 0, o) + 1
            pos.append(doc.point(line, units(text[start:o], "utf-16"), conv))
        doc.apply(pos[0], pos[1], new)
        text = text[:a] + new + text[b:]
        assert doc.text == text
    assert len(doc.lines) == text.count("\n") + 1


def test_word_start():
    doc = Doc("x = greet_1(")
    assert doc.word_start(0, 11) == 4 and doc.word_start(0, 12) == 12 and doc.word_start(0, 0) == 0
