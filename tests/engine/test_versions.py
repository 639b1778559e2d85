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


def test_the_budget_counts_a_saved_state_as_cached(tiny_model, tmp_path):
    """The first request after a restart: a plan the budget would cut if computed is restored whole
    instead (a restore takes milliseconds), and one of an edited file keeps the saved head up to the
    first changed line, the budget buying the rest. Both answers are exact."""
    from efim_local.engine.speed import PrefillSpeed

    store = StoreConfig(tmp_path / "kv", min_tokens=16)
    old = sources()[4][:2400]
    cur = old.index("\n", 1800) + 1
    with Engine(small_config(), tiny_model, store=store) as e:  # yesterday: the whole plan, saved at close
        first = e.complete(CompletionRequest(old, cur, path="f.py", layout="efim", max_prompt_ms=0, max_tokens=8))
    budget = 60  # ms, at 1 ms a token: far less than the plan's tokens
    assert first.tokens.prompt > 4 * budget
    edit = old.index("\n", 1200) + 1
    new = old[:edit] + "    changed = True\n" + old[edit:]
    with Engine(small_config(), tiny_model, store=store) as e, Engine(small_config(n_slots=1), tiny_model) as ref:
        e.speed = PrefillSpeed.fixed(1.0)
        same = e.complete(CompletionRequest(old, cur, path="f.py", layout="efim", max_prompt_ms=budget, max_tokens=8))
        assert not same.context["reduced"] and same.cache_tier == "disk" and same.tokens.evaluated <= 2
        assert same.token_ids == first.token_ids
        e.clear_slots()
        e.forget("f.py")
        req = CompletionRequest(new, cur + 19, path="f.py", layout="efim", max_prompt_ms=budget, max_tokens=8)
        edited = e.complete(req)
        unchanged = len(e.planner.tokenize(new[:edit])) - e.session("f.py").anchor.window
        assert edited.cache_tier == "disk" and edited.tokens.evaluated <= budget
        assert edited.context["head_tokens"] >= unchanged - 2  # the saved head, not what the budget could buy
        assert edited.token_ids == ref.run(e.plan(req).tokens, Options(max_tokens=8), cold=True).token_ids


def test_a_counted_state_survives_the_save_that_frees_its_slot(tiny_model, tmp_path):
    """Back to a region whose state is saved, while the file's slot holds another region's unsaved
    plan: saving that plan (which replaces the file's older states) keeps the state the budget
    counted, and the request restores it instead of computing the whole plan over its budget."""
    from efim_local.engine.speed import PrefillSpeed

    text = sources()[4]
    a, b = text.index("\n", 600) + 1, text.index("\n", len(text) - 400) + 1
    with Engine(small_config(n_slots=1, n_ctx_seq=512), tiny_model,
                store=StoreConfig(tmp_path / "kv", min_tokens=16)) as e:
        e.complete(CompletionRequest(text, a, path="f.py", layout="efim"))
        e.flush()  # region A's state is saved
        e.complete(CompletionRequest(text, b, path="f.py", layout="efim"))  # the slot: region B, not saved
        e.speed = PrefillSpeed.fixed(1.0)
        out = e.complete(CompletionRequest(text, a, path="f.py", layout="efim", max_prompt_ms=60))
        assert out.cache_tier in ("ram", "disk") and out.tokens.evaluated <= 60, (out.cache_tier, out.tokens)
