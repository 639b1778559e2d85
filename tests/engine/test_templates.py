"""FIM templates resolved against the tiny model's real vocabulary."""

from efim_local.prompt import templates
from efim_local.training.bpe import FILE_SEP, FIM_MID, FIM_PAD, FIM_PRE, FIM_SUF
from efim_local.prompt.planner import FileSession, Planner


def test_gguf_ids(model):
    t = templates.resolve(model)
    ids = model.fim_ids()
    assert t.source == "gguf"
    assert t.markers.pre == (ids["pre"],) and t.markers.suf == (ids["suf"],) and t.markers.mid == (ids["mid"],)
    assert t.markers.pre == (model.token_id(FIM_PRE),) and t.markers.mid == (model.token_id(FIM_MID),)
    assert {model.token_id(FIM_PAD), model.token_id(FILE_SEP)} <= t.stop_tokens


def test_family_lookup_by_token_text(model):
    t = templates.resolve(model, family="qwen", order="spm")
    assert t.markers.suf == (model.token_id(FIM_SUF),) and t.markers.order == "spm"
    plan = Planner(model.tokenize, t.markers).plan(FileSession(), "ab\ncd", 4, "efim")
    assert plan.tokens[0] == model.token_id(FIM_SUF)


def test_text_template(model):
    t = templates.resolve(model, text=templates.parse_text_template("<PRE>,<SUF>,<MID>,spm"))
    assert t.source == "text" and t.markers.order == "spm"
    assert t.markers.pre == tuple(model.tokenize("<PRE>"))
    assert "<PRE>" in t.stop_strings
