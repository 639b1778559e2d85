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
    decoded = b"".join(model.piece(t) for t in s.ids if t not in (sp.pre, sp.suf, sp.mid, sp.eot)).decode()
    if s.kind == "plain":
        assert decoded == text and all(s.loss[:-1])
    else:
        assert sorted(decoded) == sorted(text)  # the same characters, rearranged around the hole
        first = s.loss.index(True)
        assert s.ids[first] == sp.mid or s.kind == "efim"


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
