"""Token healing's back-off: every trailing token that could merge with what follows, not only a word's end."""

from efim_local.prompt.healing import Healer

PIECES = [b"ret", b"ur", b"urn", b"begin", b"return", b" ret", b" return", b"num", b"be", b" numbers", b" in", b" ",
          b" len", b" =", b"x", b"    ", b"        ", b"   ", b" if", b"(", b"()", b")", b'"', b'"""',
          b"\xe6", b"\xe6\x97\xa5", b"\n", b"\n\n", b"sum", b"_", b"_max", b"a", b"b", b"c"]
H = Healer(PIECES)
tok = {p: i for i, p in enumerate(PIECES)}


def test_backoff_reaches_every_token_a_continuation_could_merge_with():
    assert H.backoff([b"x", b" =", b" "]) == 1  # after "= ": the space belongs to the next word
    assert H.backoff([b"    "]) == 1  # indentation that a longer run of spaces extends
    assert H.backoff([b" in", b" ", b"ret", b"ur"]) == 3  # " retur" in three pieces: " return" starts with it
    assert H.backoff([b" ret", b"ur"]) == 2  # " retur": " return" starts with it
    assert H.backoff([b"num", b"be"]) == 1  # no token starts with "numbe": only "be" goes
    assert H.backoff([b"sum", b"("]) == 1  # "(" merges into "()"
    assert H.backoff([b'"']) == 1  # a quote into '"""'
    assert H.backoff([b"\xe6"]) == 1  # a partial UTF-8 character
    assert H.backoff([b"sum", b")"]) == 0  # nothing starts with ")" and goes on
    assert H.backoff([b"ret", b"ur"], limit=1) == 1
    # a fragment-trained model: only a last token that ends a word
    assert [H.backoff(p, word_end=True) for p in ([b" ret", b"ur"], [b"x", b" =", b" "], [b"    "], [])] == [1, 0, 0, 0]


def test_allowed_tokens_spell_the_backed_off_text_or_a_prefix_of_it():
    got = {PIECES[i] for i in H.allowed(b" retur")}
    assert got == {b" return", b" ", b" ret"}
    assert H.extends(b" ") and H.extends(b"ret") and not H.extends(b"return") and not H.extends(b"zzz")
