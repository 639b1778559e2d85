"""Speculative decoding with completion drafts (issue 24): at temperature 0, greedy answers whose
tokens are verified in batches are token-identical to plain decoding, whatever the drafts are."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from efim_local.engine import CompletionRequest, Engine, drafts

from tests.helpers import small_config, sources

CFG = dict(n_ctx_seq=1024, max_tokens=40)


@pytest.fixture(scope="module")
def engine(tiny_model):
    with Engine(small_config(drafts=True, **CFG), tiny_model) as e:
        yield e


@pytest.fixture(scope="module")
def plain(tiny_model):
    with Engine(small_config(drafts=False, **CFG), tiny_model) as e:
        yield e


def doc_at(i: int, at: int) -> tuple[str, int]:
    src = sources()[i][:4000]
    return src, src.index("\n", at) + 1


class Scripted:
    """Drafts that follow the true greedy continuation for ``right`` tokens, then go astray."""

    def __init__(self, truth, right, wrong, n_vocab):
        self.truth, self.right, self.wrong, self.n_vocab = truth, right, wrong, n_vocab
        self.verified = 0

    def propose(self, ids):
        self.verified += 1
        k = len(ids)
        good = list(self.truth[k:k + self.right])
        return good + [(t * 7919 + k) % self.n_vocab for t in range(self.wrong)]

    def taken(self, *a):
        pass


def counted(engine):
    s = engine.decoder.draft_stats
    return s.verifications, s.drafted, s.accepted


@settings(max_examples=12, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(i=st.integers(0, 5), at=st.integers(200, 3500), lines=st.sampled_from([None, 1, 3]))
def test_drafted_answers_equal_plain_decoding(engine, plain, i, at, lines):
    doc, cur = doc_at(i, at)
    how = dict(max_lines=lines)
    engine.clear_slots()
    plain.clear_slots()
    want = plain.complete(CompletionRequest(doc, cur, path="a.py", **how))
    got = engine.complete(CompletionRequest(doc, cur, path="a.py", **how))
    assert got.token_ids == want.token_ids and got.text == want.text and got.stop_reason == want.stop_reason


@settings(max_examples=10, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(i=st.integers(0, 5), at=st.integers(200, 3500), right=st.integers(0, 8), wrong=st.integers(0, 8))
def test_any_drafts_verify_to_the_greedy_tokens(engine, plain, i, at, right, wrong):
    """Drafts right for a while, then wrong, cost decodes but never change a token; the KV of
    rejected drafts is cut (the next keystroke's reuse sees only real tokens)."""
    doc, cur = doc_at(i, at)
    plain.clear_slots()
    engine.clear_slots()
    want = plain.complete(CompletionRequest(doc, cur, path="b.py"))
    script = Scripted(want.token_ids + [0] * 16, right, wrong or (0 if right else 1), engine.model.n_vocab)
    real = engine.decoder.drafter
    engine.decoder.drafter = lambda *a: script
    try:
        got = engine.complete(CompletionRequest(doc, cur, path="b.py"))
    finally:
        engine.decoder.drafter = real
    assert got.token_ids == want.token_ids and got.text == want.text
    assert script.verified > 0
    if right >= 2 and len(want.token_ids) > 8:
        assert script.verified < len(want.token_ids)  # several tokens per verification
    slot = engine.slots.slots[got.slot]
    prompt = np.asarray(got.prompt.tokens, dtype=np.int32)
    assert np.array_equal(slot.tokens[:len(prompt)], prompt)
    assert engine.ctx.seq_pos_max(slot.seq) == len(slot.tokens) - 1  # no KV beyond what it says it holds


def test_sampling_does_not_draft(engine):
    doc, cur = doc_at(0, 1000)
    before = counted(engine)
    engine.complete(CompletionRequest(doc, cur, path="c.py", temperature=0.8, seed=3))
    assert counted(engine) == before


def test_repetitive_text_is_drafted_from_the_file(engine, plain):
    """A file of repeated lines: n-grams of the prompt draft most tokens, verified several at a time."""
    doc = "".join(f"    x{k % 3} = compute(x{k % 3}, {k % 3})\n" for k in range(60))
    cur = len(doc)
    engine.clear_slots()
    plain.clear_slots()
    before = counted(engine)
    got = engine.complete(CompletionRequest(doc, cur, path="d.py"))
    want = plain.complete(CompletionRequest(doc, cur, path="d.py"))
    assert got.token_ids == want.token_ids
    assert counted(engine)[0] > before[0]


def test_rejoin_text():
    assert drafts.rejoin_text("\n    return x\nfoo") == "\n    return x\n"
    assert drafts.rejoin_text(")\n    total = 1\n") == ")\n    total = 1\n"  # ")" alone is too little
    assert drafts.rejoin_text(")\n") == ""
    assert drafts.rejoin_text("\n\n    return total\n") == "\n\n    return total\n"
    assert drafts.rejoin_text("x = 1") == ""  # the suffix ends first: no rejoin


def test_an_answer_that_rejoins_the_suffix_stops_there(engine):
    """Output that reproduces the suffix's first line ends before it (stop reason rejoin)."""
    from efim_local.engine.stream import StopRules, TextStream

    s = TextStream(StopRules(max_tokens=64, rejoin="\n    return total\n"))
    out = "".join(s.feed(p.encode()) for p in ["total = a", "\n   ", " return", " total\n", "more"])
    assert out == "total = a" and s.text == "total = a" and s.stop_reason == "rejoin"


def test_find_suffix(engine):
    m = engine.template.markers
    prompt = np.asarray([*m.bos, *m.pre, 5, 6, *m.suf, 7, 8, 9, *m.mid, 10], dtype=np.int32)
    assert list(drafts.find_suffix(prompt, m)) == [7, 8, 9]


@settings(max_examples=3, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(i=st.integers(0, 5), at=st.integers(200, 3500), right=st.integers(0, 6), wrong=st.integers(1, 6))
def test_sliding_window_models_cut_rejected_drafts_too(tiny_model_swa, i, at, right, wrong):
    """A Gemma-3-style model (32-token window, kept whole: swa_full): the KV of rejected drafts is cut
    and the answer is the plain one."""
    doc, cur = doc_at(i, at)
    with Engine(small_config(drafts=False, **CFG), tiny_model_swa) as plain_swa:
        # (past any special token the random model draws: it would end the answer before a draft)
        want = plain_swa.complete(CompletionRequest(doc, cur, path="s.py", ignore_eog=True))
    with Engine(small_config(drafts=True, **CFG), tiny_model_swa) as e:
        script = Scripted(want.token_ids + [0] * 16, right, wrong, e.model.n_vocab)
        e.decoder.drafter = lambda *a: script
        got = e.complete(CompletionRequest(doc, cur, path="s.py", ignore_eog=True))
    assert got.token_ids == want.token_ids and script.verified > 0
