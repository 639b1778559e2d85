"""The sub-token evaluation's pieces (efim_local/bench/subtoken.py) on the tiny model, and the layout and
healing defaults the engine picks from GGUF metadata for each kind of model (docs/models.md)."""

import random

import numpy as np
import pytest

from efim_local.bench import subtoken as st
from efim_local.bench import subtoken_score as sc
from efim_local.config import Config, ContextParams
from efim_local.engine.engine import Engine, make_planner
from efim_local.engine.models import KIND_FIM, KIND_FRAGMENT, KIND_TEXT, default_model
from efim_local.request import CompletionRequest
from efim_local.llama import Batch, Context, Model

CODE = '''import os

def read_config(path, default=None):
    """Read a configuration file."""
    with open(path) as handle:
        values = parse_values(handle.read())
    return values.get("settings", default)


class Store(dict):
    def lookup(self, key):
        return self.get(key, None)
'''


def test_cursor_classes_are_what_they_claim():
    cursors = {cls: st.sample_cursors([CODE], cls, 20, random.Random(1)) for cls in st.CLASSES}
    for c in cursors["mid-word"]:
        assert st.is_word(CODE[c.offset - 1]) and st.is_word(CODE[c.offset])
    for c in cursors["boundary"]:
        assert not st.is_word(CODE[c.offset - 1]) and CODE[c.offset - 1] != "\n" and st.is_word(CODE[c.offset])
    for c in cursors["mid-word"] + cursors["boundary"]:
        assert c.hole(CODE) == CODE[c.offset:].split("\n", 1)[0]
        assert c.hole(CODE).startswith(c.word(CODE)) and c.word(CODE)
        assert CODE[c.line_start - 1:c.line_start] in ("", "\n")
    assert st.cursor_class(CODE, CODE.index("config(")) == "mid-word"
    assert st.cursor_class(CODE, CODE.index("read_config")) == "boundary"  # after "def "
    assert st.cursor_class(CODE, CODE.index("(path")) is None  # a word ends here: neither class


@pytest.fixture(scope="module")
def scorer(tiny_model):
    with Model(tiny_model) as m, Context(m, ContextParams(n_ctx_seq=64, n_slots=64, n_batch=2048,
                                                           kv_unified=True, n_threads=1)) as ctx:
        tmpl, planner = make_planner(m, Config(model=str(tiny_model)))
        yield sc.Scorer(m, ctx, tmpl.stop_tokens, max_new=8, capacity=600), planner


def test_paths_are_exactly_the_consistent_first_tokens(scorer):
    s, _ = scorer
    v = s.vocab
    target = b"values.get(key"
    got = set()
    for p in sc.paths(v, target):
        got |= set(int(t) for t in p.first)
        if p.steps:  # the rest spells the target out, in the tokenizer's own tokens
            assert p.first_piece + b"".join(piece for _, piece in p.steps) == target
    want = {t for t in range(s.model.n_vocab) if (pc := v.piece(t)) and (target.startswith(pc) or pc.startswith(target))}
    assert got == want


def direct_logp(model: Model, prompt, path: sc.Path, heal: bytes, vocab: sc.Vocabulary) -> float:
    """The same path's probability, one sequence, one token at a time, from a fresh context."""
    with Context(model, ContextParams(n_ctx_seq=512, n_slots=1, n_threads=1)) as ctx, Batch(512) as b:
        fed = [int(path.first[0]), *path.rest] if path.steps else []
        toks = list(prompt) + fed
        for i, t in enumerate(toks):
            b.add(t, i, 0, logits=i >= len(prompt) - 1)
        ctx.decode(b)
        rows = [ctx.logits(i) for i in range(len(prompt) - 1, len(toks))]
    total = 0.0
    for row, (ids, piece) in zip(rows, [(path.first, path.first_piece), *path.steps]):
        p = np.exp(row.astype(np.float64) - row.max())
        mass = p[vocab.allowed(heal)].sum() if heal else p.sum()
        total += np.log(p[ids].sum() / mass)
        heal = heal[len(piece):] if len(piece) < len(heal) else b""
    return total


def test_scores_equal_token_probabilities_computed_directly(scorer):
    s, planner = scorer
    text = CODE
    cur = st.Cursor("t", 0, text.index("handle.read") + 3, "mid-word", text.index("        values"),
                    text.index("\n", text.index("handle.read")))
    job = st.infill_job(planner, text, cur, "efim", 64, 32, 12)
    (res,) = s.score([job])
    v = s.vocab
    # Unhealed: the sum over first tokens of the product of token probabilities, each path decoded alone.
    u = np.logaddexp.reduce([direct_logp(s.model, job.prompt, p, b"", v) for p in sc.paths(v, job.target)])
    assert res.bits_u == pytest.approx(-u / np.log(2), abs=2e-3)
    # Healed: the last typed token backed off, healing's constraint renormalising until it is spelled out,
    # summed over every tokenization consistent with the healed prefix.
    r = v.piece(job.prompt[job.cut])
    healed = job.prompt[:job.cut]
    assert res.healed and r
    h = np.logaddexp.reduce([direct_logp(s.model, healed, p, r, v) for p in sc.paths(v, r + job.target)])
    assert res.bits_h == pytest.approx(-h / np.log(2), abs=2e-3)
    # Oracle: P(r + target) / P(r), no constraint.
    num = np.logaddexp.reduce([direct_logp(s.model, healed, p, b"", v) for p in sc.paths(v, r + job.target)])
    den = np.logaddexp.reduce([direct_logp(s.model, healed, p, b"", v) for p in sc.paths(v, r)])
    assert res.bits_o == pytest.approx(-(num - den) / np.log(2), abs=2e-3)
    assert res.chars == len(job.target) == len("dle.read())")  # the rest of the line is shorter than 12


def test_batched_scores_do_not_depend_on_the_group(scorer):
    s, planner = scorer
    cursors = st.sample_cursors([CODE], "mid-word", 6, random.Random(3))
    jobs = [st.infill_job(planner, CODE, c, lay, 64, 32, 10) for c in cursors for lay in ("fim", "efim")]
    together = s.score(jobs)
    alone = [s.score([j])[0] for j in jobs]
    for a, b in zip(together, alone):
        assert a.bits_u == pytest.approx(b.bits_u, abs=2e-3) and a.bits_h == pytest.approx(b.bits_h, abs=2e-3)
        assert (a.em_word_u, a.em_word_h) == (b.em_word_u, b.em_word_h)


def test_greedy_exact_match_rules():
    g = sc._Greedy(0, 0, b"rea", b"d()", b"d")  # typed "rea|d()": healing backed off "rea"
    g.feed(b"re", False)  # a proper prefix of the backed-off text: nothing shown yet
    g.feed(b"ad(", False)
    assert g.text == b"d(" and not g.done
    g.feed(b")\n", False)
    assert g.done and g.exact() == (True, True)
    g = sc._Greedy(0, 0, b"", b"d()", b"d")
    g.feed(b"d)", False)
    assert g.done and g.exact() == (True, False)  # the word ended right, the line did not
    g = sc._Greedy(0, 0, b"", b"d()", b"d")
    for piece in (b"d", b"()", b"\n"):
        g.feed(piece, False)
    assert g.exact() == (True, True)
    g = sc._Greedy(0, 0, b"", b"d()", b"d")
    g.feed(b"dx", False)
    assert g.done and g.exact() == (False, False)  # the word goes on: not the word's end
    g = sc._Greedy(0, 0, b"", b"d", b"d")
    g.feed(b"d", False)
    g.feed(b"", True)
    assert g.exact() == (True, True)  # end of generation right after the line


# -- the defaults the engine picks per kind of model ------------------------------------------------------
@pytest.mark.parametrize("kind", [KIND_FRAGMENT, KIND_FIM, KIND_TEXT])
def test_layout_and_healing_defaults_from_metadata(kind, tiny_model, tiny_model_nofim):
    path, template = {KIND_FRAGMENT: (default_model(), None), KIND_FIM: (tiny_model, None),
                      KIND_TEXT: (tiny_model_nofim, "<PRE>,<SUF>,<MID>")}[kind]
    cfg = Config(model=str(path), fim_template=template, context=ContextParams(n_ctx_seq=512, n_slots=1))
    with Engine(cfg, path) as e:
        status = e.status()
        assert status["layout"] == "efim" and status["heal"] is True
        assert status["fragment_trained"] is (kind == KIND_FRAGMENT)
        if kind == KIND_FRAGMENT:
            assert "efim.fragment_trained=true" in status["layout_reason"]
        else:
            assert status["layout_reason"].startswith(kind)
        assert status["heal_reason"].startswith(kind)
        assert e.planner.lift_indent is (kind != KIND_FRAGMENT)  # (trained with line-start anchors)
        # The default is applied: a mid-word request heals (the typed tokens that could merge with what
        # follows backed off: a fragment-trained model's last one only) unless told not to.
        doc, cur = CODE, CODE.index("handle.read") + 3
        req = lambda **kw: CompletionRequest(doc, cur, path=f"d-{kw}.py", max_tokens=2, **kw)
        pieces = [e.model.piece(t) for t in e.plan(req()).middle_tokens]
        k = e.healer.backoff(pieces, word_end=kind == KIND_FRAGMENT)
        assert k >= 1 and (k == 1 or kind != KIND_FRAGMENT)
        default, on, off = e.complete(req()), e.complete(req(heal=True)), e.complete(req(heal=False))
        assert default.tokens.prompt == on.tokens.prompt == off.tokens.prompt - k
        assert default.text == on.text
    configured = Config(model=str(path), fim_template=template, layout="fim",
                        context=ContextParams(n_ctx_seq=512, n_slots=1))
    with Engine(configured, path) as e:
        assert e.status()["layout"] == "fim" and "configured" in e.status()["layout_reason"]
    with Engine(Config(model=str(path), fim_template=template, heal=False), path) as e:
        assert e.status()["heal"] is False and e.status()["heal_reason"] == "configured heal = false"
