"""Fragment splitting for training samples (pure; the tokenizing tests are in tests/engine)."""

import random

from hypothesis import given
from hypothesis import strategies as st

from efim_local.training import fragments as F


@given(text=st.text(max_size=300), seed=st.integers(0, 2 ** 32), rate=st.sampled_from([0.0, 0.05, 0.3, 1.0]))
def test_fragments_concatenate_back(text, seed, rate):
    parts = F.split_fragments(text, random.Random(seed), rate)
    assert "".join(parts) == text and all(parts)
    if rate == 0:
        assert len(parts) == (1 if text else 0)
    if rate == 1.0:
        assert all(len(p) == 1 for p in parts)  # a cut between every two characters


def test_fragments_cut_mid_word():
    parts = F.split_fragments("def fibonacci_number(n):\n" * 40, random.Random(1), 1 / 8)
    assert len(parts) > 40
    assert any(p[-1].isalnum() and q[0].isalnum() for p, q in zip(parts, parts[1:]))  # a word split in two


def test_fragment_tokenize_tokenizes_each_fragment_on_its_own():
    text = "def fibonacci_number(n):\n" * 10
    tokenize = lambda s: [len(s)]  # one "token" per fragment, so the fragments show
    ids = F.fragment_tokenize(text, tokenize, random.Random(3), 1 / 8)
    assert ids == [len(p) for p in F.split_fragments(text, random.Random(3), 1 / 8)] and sum(ids) == len(text)
