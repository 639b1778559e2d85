"""Repository context in plans (issue 25, repo/leads.py and engine/repoctx.py), in-process on the tiny
model, over small real git repositories the tests create: the lead is a stable head that keystrokes
never prefill again, it is rebuilt in idle time when imports change or a save changes the project, a
renamed file and a .gitignored one are seen as git sees them, and reused KV answers as a cold run does."""

import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from efim_local.engine import CompletionRequest, Engine
from efim_local.engine.steps import drive
from efim_local.engine.repoctx import LEAD_S
from efim_local.repo.discover import imports_fingerprint
from efim_local.repo.leads import CHARS_PER_TOKEN
from efim_local.engine.speed import PrefillSpeed
from efim_local.repo import TierLimits
from efim_local.kv.settings import store_config
from efim_local.request import Options

from tests.helpers import REPO_APP as APP, REPO_GEOMETRY as GEOMETRY, REPO_UTIL, make_repo, small_config


@pytest.fixture
def repo(tmp_path) -> Path:
    return make_repo(tmp_path / "shapes")


@pytest.fixture
def engine(tiny_model, tmp_path):
    cfg = small_config(n_ctx_seq=2048, repo_context=True, min_state_tokens=16)
    with Engine(cfg, tiny_model, store=store_config(replace(cfg, state_dir=str(tmp_path / "kv")))) as e:
        yield e


@pytest.fixture(scope="module")
def reference(tiny_model):
    with Engine(small_config(n_ctx_seq=2048, n_slots=1), tiny_model) as e:
        yield e


def ask(engine, path: Path, text: str, cursor: int):
    return engine.complete(CompletionRequest(text, cursor, path=str(path)))


def lead_text(engine, path: Path) -> str:
    return engine.model.detokenize(list(engine.session(str(path)).lead))


def settle(engine, path: Path):
    """What the daemon does after a request, while idle: rebuild the file's context if stale."""
    if engine.repo.stale(str(path)):
        drive(engine.repo_build.rebuild_steps(str(path)))


def test_the_lead_is_a_stable_head_shared_by_the_project_and_never_prefilled_by_a_keystroke(engine, reference, repo):
    app = repo / "app.py"
    text = APP
    cursor = text.index("    return total")
    first = ask(engine, app, text, cursor)
    assert first.reanchor == "new_session" and first.context["repo"]["tokens"] == 0  # file-only until idle work
    settle(engine, app)
    shown = lead_text(engine, app)
    assert "# repository: shapes" in shown and "def distance(a: Point, b: Point) -> float:" in shown
    assert "secret" not in shown  # .gitignored
    lead = engine.session(str(app)).lead
    bos = engine.planner.markers.bos
    n_head = len(bos) + len(lead)
    out = ask(engine, app, text, cursor)
    assert out.reanchor == "repo_context" and out.tokens.evaluated <= 2
    rep = out.context["repo"]
    assert rep["t0_tokens"] > 0 and rep["t1_tokens"] > 0 and rep["tokens"] == len(lead)
    assert tuple(out.prompt.tokens[:n_head]) == (*bos, *lead)
    # Keystrokes: type a line, a new line, an edit far above the anchor; the lead stays cached.
    reasons = []
    for typed in ("    x", "    x = ", "    x = p.", "    x = p.norm()\n", "    x = p.norm()\n    y"):
        t = text[:cursor] + typed + text[cursor:]
        out = ask(engine, app, t, cursor + len(typed))
        reasons.append(out.reanchor)
        assert out.tokens.cached >= n_head, (typed, out.tokens)
        assert out.context["repo"]["tokens"] == len(lead)
        cold = reference.run(out.prompt.tokens, Options(max_tokens=8), cold=True, closers=out.prompt.closers)
        assert cold.text == out.text  # reused KV answers as a cold run does (temperature 0)
    t = text.replace("def main() -> float:", "def main() -> float:  # entry")
    out = ask(engine, app, t, t.index("    return total"))
    reasons.append(out.reanchor)
    assert out.reanchor == "edit_before_anchor" and out.tokens.cached >= n_head
    assert "repo_context" not in reasons[1:]
    # Another file of the project starts with the same T0 tokens.
    geo = repo / "pkg" / "geometry.py"
    ask(engine, geo, GEOMETRY, GEOMETRY.index("def midpoint"))
    settle(engine, geo)
    other = engine.session(str(geo)).lead
    t0 = engine.repo.leads[str(app)].t0
    assert t0 > 0 and other[:t0] == lead[:t0] and other != lead


def test_an_added_import_rebuilds_t1_in_idle_time_and_the_old_plan_serves_meanwhile(engine, repo):
    app = repo / "app.py"
    cursor = APP.index("    return total")
    ask(engine, app, APP, cursor)
    settle(engine, app)
    doc = '"""``value`` within [low, high]."""'  # T1 shows clamp's first lines; T0 its header only
    assert doc not in lead_text(engine, app)
    old_lead = engine.session(str(app)).lead
    # A use of a name not imported changes nothing; an import line changes the fingerprint.
    text = APP.replace("    return total", "    total = total + 1\n    return total")
    assert imports_fingerprint(text) == imports_fingerprint(APP)
    text = "from pkg.util import clamp\n" + APP.replace("    return total", "    return clamp(total, 0, 1)")
    assert imports_fingerprint(text) != imports_fingerprint(APP)
    cur = text.index("    return clamp")
    out = ask(engine, app, text, cur)
    assert out.reanchor == "edit_before_anchor" and engine.session(str(app)).lead == old_lead  # the old lead serves
    assert engine.repo.stale(str(app))
    settle(engine, app)
    assert doc in lead_text(engine, app)
    out = ask(engine, app, text, cur)
    assert out.reanchor == "repo_context" and out.tokens.evaluated <= 2
    assert not engine.repo.stale(str(app))


def test_a_renamed_file_and_an_ignored_file_are_seen_as_git_sees_them(engine, repo):
    app = repo / "app.py"
    text = "from pkg.util import clamp\n" + APP
    ask(engine, app, text, text.index("    return total"))
    settle(engine, app)
    assert "# file: pkg/util.py" in lead_text(engine, app)
    # A new file that .gitignore covers never enters the index, saved or not.
    (repo / "secret_gen.py").write_text("def leaked_secret_function(token, more):\n    return token\n")
    assert engine.repo.saved(str(repo / "secret_gen.py")) == []
    # git mv pkg/util.py pkg/tools.py, the import follows it.
    subprocess.run(["git", "-C", str(repo), "mv", "pkg/util.py", "pkg/tools.py"], check=True)
    engine.repo.saved(str(repo / "pkg" / "util.py"))
    engine.repo.saved(str(repo / "pkg" / "tools.py"))
    text = text.replace("pkg.util", "pkg.tools")
    ask(engine, app, text, text.index("    return total"))
    assert engine.repo.stale(str(app))
    settle(engine, app)
    shown = lead_text(engine, app)
    assert "pkg/util.py" not in shown and "# file: pkg/tools.py" in shown and "def clamp" in shown
    assert "leaked_secret_function" not in shown


def test_a_save_that_changes_a_definition_rebuilds_the_files_that_use_it(engine, repo):
    app = repo / "app.py"
    ask(engine, app, APP, APP.index("    return total"))
    settle(engine, app)
    geo = repo / "pkg" / "geometry.py"
    geo.write_text(GEOMETRY.replace("def distance(a: Point, b: Point) -> float:",
                                    "def distance(a: Point, b: Point, squared: bool = False) -> float:"))
    engine.repo.saved(str(geo))
    assert engine.repo.stale(str(app))
    settle(engine, app)
    assert "squared: bool = False" in lead_text(engine, app)


def open_doc(engine, path: Path, text: str, version: int) -> None:
    """What the daemon's didOpen/didChange do to the engine's files: an editor syncs the text."""
    f = engine.files.entry(str(path))
    f.text, f.version, f.open = text, version, True


def test_work_in_another_file_joins_t2_and_editor_definitions_join_t1(engine, reference, repo):
    app, geo, util = repo / "app.py", repo / "pkg" / "geometry.py", repo / "pkg" / "util.py"
    cursor = APP.index("    return total")
    open_doc(engine, app, APP, 1)
    ask(engine, app, APP, cursor)
    settle(engine, app)
    assert engine.session(str(app)).lead and "farthest" not in lead_text(engine, app)
    assert ask(engine, app, APP, cursor).reanchor == "repo_context"
    # The user works in geometry.py (unsaved text: only T2 can show it), then comes back.
    geo_text = GEOMETRY + "\n\ndef farthest(points):\n    return max(points, key=Point.norm)\n"
    open_doc(engine, geo, geo_text, 2)
    ask(engine, geo, geo_text, geo_text.index("    return max"))
    engine.repo.visit(str(geo))
    old = engine.session(str(app)).lead
    assert engine.repo.stale(str(app))
    out = ask(engine, app, APP, cursor)  # the first request after the switch: the old plan serves
    assert out.reanchor is None and engine.session(str(app)).lead == old and out.context["repo"]["t2_tokens"] == 0
    engine.repo.visit(str(app))
    settle(engine, app)
    shown = lead_text(engine, app)
    assert "def farthest(points):" in shown and shown.index("def farthest") > shown.index("def distance")  # T2 after T1
    lead = engine.session(str(app)).lead
    n_head = len(engine.planner.markers.bos) + len(lead)
    out = ask(engine, app, APP, cursor)
    assert out.reanchor == "repo_context" and out.tokens.evaluated <= 2 and out.context["repo"]["t2_tokens"] > 0
    # Typing in app.py never changes its own T2: keystrokes reuse the whole lead and answer as cold runs.
    for version, typed in enumerate(("    x", "    x = q", "    x = q.norm()\n    y"), 2):
        text = APP[:cursor] + typed + APP[cursor:]
        open_doc(engine, app, text, version)
        out = ask(engine, app, text, cursor + len(typed))
        engine.repo.visit(str(app))
        assert not engine.repo.stale(str(app)) and out.tokens.cached >= n_head and out.reanchor != "repo_context"
        cold = reference.run(out.prompt.tokens, Options(max_tokens=8), cold=True, closers=out.prompt.closers)
        assert cold.text == out.text
    # Where the editor's "go to definition" landed for app.py: lerp (app never imports it) joins T1.
    lerp = REPO_UTIL[:REPO_UTIL.index("def lerp")].count("\n")
    other = make_repo(repo.parent / "other")  # another git tree's file: left out, and no project made for it
    projects = list(engine.repo.projects)
    assert engine.repo.set_definitions(str(app), [(str(util), lerp), ("/elsewhere/x.py", 3),
                                                  (str(other / "pkg" / "util.py"), 0)]) == (True, 1)
    assert list(engine.repo.projects) == projects
    assert engine.repo.set_definitions(str(app), [(str(util), lerp)]) == (False, 1)
    assert engine.repo.stale(str(app))
    settle(engine, app)
    assert "def lerp(a: float, b: float, t: float) -> float:\n    return a + (b - a) * t" in lead_text(engine, app)
    out = ask(engine, app, text, cursor + len(typed))
    assert out.reanchor == "repo_context" and out.tokens.evaluated <= 2


def test_a_slow_machine_gets_a_lead_that_prefills_in_about_lead_s(engine, repo):
    """The tiers are sized to the learned speed: every change of a lead re-prefills the file's plan
    while the user types, so a slow machine (or a big model) gets a smaller one."""
    engine.speed = PrefillSpeed.fixed(0.01)  # fast: the full-size tiers, as far as half the slot holds them
    fast = engine.repo.tier_limits()
    assert fast.t0_chars + fast.t1_chars <= engine.repo.max_lead * CHARS_PER_TOKEN
    assert fast.t1_chars <= TierLimits().t1_chars
    engine.speed = PrefillSpeed.fixed(1000 * LEAD_S / 150)  # 150 tokens in LEAD_S
    small = engine.repo.tier_limits()
    assert small.t0_chars < fast.t0_chars / 4 and small.t1_chars < fast.t1_chars / 4
    app = repo / "app.py"
    ask(engine, app, APP, APP.index("    return total"))
    settle(engine, app)
    lead = engine.session(str(app)).lead
    assert 0 < len(lead) and "Euclidean distance" not in lead_text(engine, app)  # T1's snippets left out


def test_files_outside_a_git_tree_and_relative_paths_plan_file_only(engine, tmp_path):
    (tmp_path / "loose").mkdir()
    loose = tmp_path / "loose" / "a.py"
    loose.write_text(APP)
    for path in (str(loose), "a.py"):
        out = engine.complete(CompletionRequest(APP, 10, path=path))
        assert out.context["repo"]["tokens"] == 0
        assert not engine.repo.stale(path)


@pytest.mark.parametrize("which", ["tiny_model", "tiny_model_swa"])
def test_t0_comes_back_from_disk_after_a_restart(which, request, repo, tmp_path):
    """The first request of a file never seen restores T0's KV (a sliding-window model's too: its saved
    state ends one token short, the request prefills that one)."""
    model = request.getfixturevalue(which)
    cfg = small_config(n_ctx_seq=2048, repo_context=True, min_state_tokens=16)
    sc = store_config(replace(cfg, state_dir=str(tmp_path / "kv")))
    app, geo = repo / "app.py", repo / "pkg" / "geometry.py"
    with Engine(cfg, model, store=sc) as e:
        ask(e, app, APP, APP.index("    return total"))
        settle(e, app)
        t0 = e.repo.leads[str(app)].t0
    with Engine(cfg, model, store=sc) as e:
        out = ask(e, geo, GEOMETRY, GEOMETRY.index("def midpoint"))
        rep = out.context["repo"]
        assert out.reanchor == "new_session" and rep["t0_tokens"] == t0 and rep["t1_tokens"] == 0
        assert out.cache_tier == "disk" and out.tokens.cached >= len(e.planner.markers.bos) + t0 - e.swa
