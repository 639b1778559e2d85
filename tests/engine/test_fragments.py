"""Fragment tokenization and training samples with the real tokenizer of the tiny GGUF."""

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from efim_local.training import fragments as F
from efim_local.training.bpe import EOT, FIM_MID, FIM_PRE, FIM_SUF


def specials(model):
    return F.Specials(*(model.token_id(t) for t in (FIM_PRE, FIM_SUF, FIM_MID, EOT)))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(st.characters(codec="utf-8"), max_size=200), seed=st.integers(0, 2 ** 32))
def test_fragment_tokens_decode_to_text(model, text, seed):
    ids = F.fragment_tokenize(text, model.tokenize, random.Random(seed), 0.2)
    assert b"".join(model.piece(t) for t in ids).decode("utf-8") == text


def test_fragment_tokenization_yields_sub_tokens(model):
    text = "    return self.connection.execute(statement)\n" * 20
    plain = model.tokenize(text)
    frag = F.fragment_tokenize(text, model.tokenize, random.Random(0), 1 / 6)
    assert len(frag) > len(plain)  # word pieces at random boundaries


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2 ** 32))
def test_samples_are_well_formed(model, seed):
    sp = specials(model)
    text = "import os\n\ndef walk(top):\n    for root, dirs, files in os.walk(top):\n        yield root\n"
    s = F.make_sample(text, model.tokenize, sp, random.Random(seed))
    assert len(s.ids) == len(s.loss) and s.ids[-1] == sp.eot and s.loss[-1] is False
    targets = [s.ids[i + 1] for i, m in enumerate(s.loss) if m]
    assert targets[-1] == sp.eot  # the model learns to stop
    piece = lambda ids: b"".join(model.piece(t) for t in ids)
    if s.kind == "plain":
        assert piece(s.ids[:-1]) == text.encode() and all(s.loss[:-1])
        return
    # The head is PRE prefix SUF suffix MID (SUF suffix PRE prefix MID for spm), then EFIM's text typed
    # since the anchor; the trained positions are one run: the middle, then EOT. Put back in order, the
    # parts are the text: a mask one token off, or a hole cut twice, breaks the equation.
    first = s.loss.index(True)
    assert all(s.loss[first:-1]) and not any(s.loss[:first])
    at = {m: s.ids.index(m) for m in (sp.pre, sp.suf, sp.mid)}
    after = lambda m: piece(s.ids[at[m] + 1:min(i for i in at.values() if i > at[m])])  # up to the next marker
    typed = piece(s.ids[at[sp.mid] + 1:first + 1])
    assert after(sp.pre) + typed + piece(targets[:-1]) + after(sp.suf) == text.encode()
    assert targets[:-1] and (typed == b"" if s.kind.startswith("fim") else s.kind == "efim")


def test_efim_sample_layout_without_fragments(model):
    sp = specials(model)
    cfg = F.SampleConfig(fragment_rate=0, p_plain=0, p_fim=0, p_anchor_line_start=1.0)
    text = "def add(a, b):\n    return a + b\n\nprint(add(1, 2))\n"
    for seed in range(30):
        rng = random.Random(seed)
        s = F.make_sample(text, model.tokenize, sp, rng, cfg)
        assert s.kind == "efim"
        pre, suf, mid = s.ids.index(sp.pre), s.ids.index(sp.suf), s.ids.index(sp.mid)
        assert pre == 0 < suf < mid
        prefix = b"".join(model.piece(t) for t in s.ids[1:suf]).decode()
        assert prefix == "" or prefix.endswith("\n")  # the anchor is a line start
        first_target = s.loss.index(True) + 1
        head = b"".join(model.piece(t) for t in s.ids[mid + 1:first_target]).decode()
        assert "\n" not in head  # the middle head is the cursor line's text before the cursor
