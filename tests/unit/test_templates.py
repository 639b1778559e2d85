"""FIM template resolution against a fake vocabulary (tests/engine/test_templates.py uses the tiny GGUF's)."""

import pytest

from efim_local.errors import TemplateError
from efim_local.prompt import templates
from efim_local.prompt.planner import Markers


class Vocab:
    """What templates.resolve reads of a model."""

    def __init__(self, tokens=(), fim=None, bos=()):
        self.ids = {t: 100 + i for i, t in enumerate(tokens)}
        self.fim, self.bos = fim or {}, bos

    def fim_ids(self):
        return dict(self.fim)

    def token_id(self, text):
        return self.ids.get(text)

    def tokenize(self, text, special=False):
        return [ord(c) for c in text]


QWEN = ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|fim_pad|>", "<|endoftext|>", "<|file_sep|>"]


def test_every_family_names_three_markers_or_spm():
    for name, fam in templates.FAMILIES.items():
        assert fam.pre and fam.suf and (fam.mid or fam.order == "spm"), name


def test_gguf_fim_ids():
    t = templates.resolve(Vocab(fim={"pre": 5, "suf": 6, "mid": 7, "pad": 8, "sep": 9, "eot": 10}, bos=(1,)))
    assert t.source == "gguf" and t.markers == Markers((5,), (6,), (7,), "psm", (1,))
    assert t.stop_tokens == {8, 9}  # pad, rep and sep stop; the end of text is the model's own
    t = templates.resolve(Vocab(fim={"pre": 5, "suf": 6}))  # no middle token: suffix-prefix-middle order
    assert t.markers.mid == () and t.markers.order == "spm"
    assert templates.resolve(Vocab(fim={"pre": 5, "suf": 6, "mid": 7}), order="SPM").markers.order == "spm"


def test_families_are_looked_up_by_token_text():
    v = Vocab(QWEN)
    t = templates.resolve(v, family="Qwen")
    assert t.source == "family:qwen" and (t.markers.pre, t.markers.suf, t.markers.mid) == ((100,), (101,), (102,))
    assert t.stop_tokens == {103, 104, 105}  # <|repo_name|> is not in this vocabulary
    assert templates.resolve(v, family="qwen2.5-coder").markers == t.markers
    with pytest.raises(TemplateError, match="unknown FIM family 'nosuch'; known: .*qwen"):
        templates.resolve(v, family="nosuch")
    with pytest.raises(TemplateError, match=r"model has no deepseek FIM tokens \(pre, suf, mid missing\)"):
        templates.resolve(v, family="deepseek")
    with pytest.raises(TemplateError, match=r"\(mid missing\)"):
        templates.resolve(Vocab(QWEN[:2]), family="qwen")


def test_codestral_without_fim_metadata():
    t = templates.resolve(Vocab(["[SUFFIX]", "[PREFIX]"]))
    assert t.source == "family:codestral" and t.markers == Markers((101,), (100,), (), "spm")


def test_no_fim_tokens_at_all_is_a_one_line_error():
    with pytest.raises(TemplateError, match="--fim-template") as info:
        templates.resolve(Vocab(["def"]))
    assert "\n" not in str(info.value) and info.value.exit_code == 2


def test_text_templates():
    t = templates.resolve(Vocab(bos=(1,)), text=templates.parse_text_template("<P>,<S>,<M>"))
    assert t.source == "text" and t.markers == Markers((60, 80, 62), (60, 83, 62), (60, 77, 62), "psm", (1,))
    # the markers, their closing forms and end markers a model without FIM training invents
    assert t.stop_strings == ("<P>", "<S>", "<M>", "</P>", "</S>", "</M>", "<END>", "<EOT>")
    assert t.stop_tokens == frozenset()
    assert templates.parse_text_template("PRE,SUF,MID").stop == ("PRE", "SUF", "MID")  # not tag-like
    assert templates.parse_text_template("a,b,c,SPM").order == "spm"


@pytest.mark.parametrize("spec", ["onlyone", "a,b", "a,,c", ",b,c", "a,b,c,psm,x", "a,b,c,xyz"])
def test_bad_text_templates(spec):
    with pytest.raises(TemplateError):
        templates.parse_text_template(spec)


def test_bad_order():
    with pytest.raises(TemplateError, match="FIM order must be 'psm' or 'spm'"):
        templates.resolve(Vocab(fim={"pre": 5, "suf": 6, "mid": 7}), order="pms")
