"""Earlier versions of a file serve the new one: after a restart, a saved state whose tokens match the
head of the edited file (up to the first changed line) is restored, and the answer is exact."""

from efim_local.engine import CompletionRequest, Engine
from efim_local.kv import StoreConfig
from efim_local.request import Options

from tests.helpers import small_config, sources


def test_yesterdays_state_serves_todays_edited_file(tiny_model, tmp_path):
    store = StoreConfig(tmp_path / "kv", min_tokens=16)
    old = sources()[4][:2400]
    cur = old.index("\n", 1800) + 1
    with Engine(small_config(), tiny_model, store=store) as e:  # yesterday: the file as it was, saved at close
        e.complete(CompletionRequest(old, cur, path="f.py", layout="efim"))
    edit = old.index("\n", 1200) + 1  # today: a line inserted two thirds down
    new = old[:edit] + "    changed = True\n" + old[edit:]
    with Engine(small_config(), tiny_model, store=store) as e, \
            Engine(small_config(n_slots=1), tiny_model) as ref:
        req = CompletionRequest(new, cur + 19, path="f.py", layout="efim")
        out = e.complete(req)
        assert out.cache_tier == "disk"
        # The plan's tokens before the first changed line (the prefix starts at its window in the file).
        unchanged = len(e.planner.tokenize(new[:edit])) - e.session("f.py").anchor.window
        assert out.tokens.cached >= unchanged - 2
        assert out.tokens.evaluated < out.tokens.prompt - unchanged + 4
        assert out.token_ids == ref.run(e.plan(req).tokens, Options(max_tokens=8), cold=True).token_ids
