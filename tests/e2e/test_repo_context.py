"""Repository context over a real daemon's socket (issue 25): keystrokes never prefill T0/T1 again
(reason codes, evaluated token counts), a changed import is rebuilt in idle time and reported as
``repo_context``, the watcher sees a renamed file, and T0's KV comes back from disk after a restart."""

from pathlib import Path

import pytest

from efim_local.errors import InvalidParams

from tests.helpers import REPO_APP, REPO_GEOMETRY, REPO_UTIL, Daemon, make_repo, wait_until


def start(tmp: Path, model: Path) -> Daemon:
    d = Daemon(tmp, model)
    with (tmp / "config.toml").open("a") as f:
        f.write("repo_context = true\nmin_state_tokens = 16\n")
    return d.start()


def idle(c) -> None:
    wait_until(lambda: c.call("status")["idle_tasks"] == 0, what="idle work to finish")


def complete(c, path: Path, offset: int, **kw) -> dict:
    return c.call("complete", {"path": str(path), "offset": offset, "max_tokens": 4, **kw})


def change(c, path: Path, version: int, text: str) -> None:
    c.call("didChange", {"path": str(path), "version": version, "contentChanges": [{"text": text}]})


def test_keystrokes_never_prefill_the_repository_context_and_t0_survives_a_restart(tmp_path, tiny_model):
    repo = make_repo(tmp_path / "shapes")
    app = repo / "app.py"
    d = start(tmp_path / "daemon", tiny_model)
    try:
        with d.client() as c:
            c.call("didOpen", {"path": str(app), "text": REPO_APP, "version": 1, "root": str(repo)})
            idle(c)  # the open file is prefilled, its context built and switched to
            cursor = REPO_APP.index("    return total")
            out = complete(c, app, cursor)
            lead = out["context"]["repo"]
            assert lead["t0_tokens"] > 0 and lead["t1_tokens"] > 0
            assert out["tokens"]["cached"] >= lead["tokens"]  # the idle work prefilled it
            # Keystrokes on a line, then a new line: the context is cached each time.
            text, version, reasons = REPO_APP, 1, []
            for ch in "    x = p.norm()\n    y":
                text = text[:cursor] + ch + text[cursor:]
                cursor += 1
                version += 1
                change(c, app, version, text)
                out = complete(c, app, cursor)
                reasons.append(out["reanchor"])
                assert out["tokens"]["cached"] >= lead["tokens"], (ch, out["tokens"])
                assert out["tokens"]["evaluated"] < out["tokens"]["prompt"] - lead["tokens"]
                assert out["context"]["repo"] == lead
            assert "repo_context" not in reasons and "new_session" not in reasons
            # An import of a renamed module: the watcher saw the rename, idle work rebuilds T1.
            (repo / "pkg" / "util.py").rename(repo / "pkg" / "tools.py")
            text = "from pkg.tools import clamp\n" + text.replace("    return total", "    return clamp(total, 0, 1)")
            version += 1
            change(c, app, version, text)
            cursor = text.index("    return clamp")
            out = complete(c, app, cursor)
            assert out["reanchor"] == "edit_before_anchor" and out["context"]["repo"] == lead  # the old one serves
            idle(c)
            out = complete(c, app, cursor)
            assert out["reanchor"] == "repo_context" and out["tokens"]["evaluated"] <= 2
            assert out["context"]["repo"]["t1_tokens"] > lead["t1_tokens"]
            assert out["tokens"]["cached"] >= out["context"]["repo"]["tokens"]
    finally:
        d.stop()
    # A restart: the first request of a file never seen restores T0 from disk.
    d = start(tmp_path / "daemon", tiny_model)
    try:
        with d.client() as c:
            geo = repo / "pkg" / "geometry.py"
            out = complete(c, geo, REPO_GEOMETRY.index("def midpoint"), text=REPO_GEOMETRY)
            rep = out["context"]["repo"]
            assert out["reanchor"] == "new_session" and rep["t0_tokens"] > 0 and rep["t1_tokens"] == 0
            assert out["cache_tier"] == "disk" and out["tokens"]["cached"] >= rep["t0_tokens"]
    finally:
        d.stop()


def test_work_elsewhere_and_editor_definitions_reach_the_context_in_idle_time(tmp_path, tiny_model):
    """T2 (a block the user worked on in another file) and definitions an editor sends (T1) over the
    socket: each is taken in idle time, reported per tier, and the keystrokes after it reuse it."""
    repo = make_repo(tmp_path / "shapes")
    app, geo, util = repo / "app.py", repo / "pkg" / "geometry.py", repo / "pkg" / "util.py"
    d = start(tmp_path / "daemon", tiny_model)
    try:
        with d.client() as c:
            c.call("didOpen", {"path": str(app), "text": REPO_APP, "version": 1, "root": str(repo)})
            c.call("didOpen", {"path": str(geo), "text": REPO_GEOMETRY, "version": 1})
            idle(c)
            cursor = REPO_APP.index("    return total")
            lead = complete(c, app, cursor)["context"]["repo"]
            assert lead["t1_tokens"] > 0 and lead["t2_tokens"] == 0
            # The cursor settles in geometry.py, a request there; back in app.py the old plan serves.
            c.call("cursor", {"path": str(geo), "offset": REPO_GEOMETRY.index("def midpoint")})
            complete(c, geo, REPO_GEOMETRY.index("    return Point((a.x"))
            out = complete(c, app, cursor)
            assert out["context"]["repo"] == lead and out["reanchor"] != "repo_context"
            idle(c)
            out = complete(c, app, cursor)
            with_t2 = out["context"]["repo"]
            assert out["reanchor"] == "repo_context" and out["tokens"]["evaluated"] <= 2
            assert with_t2["t2_tokens"] > 0 and with_t2["t1_tokens"] == lead["t1_tokens"]
            for k, ch in enumerate("    x = q"):  # keystrokes in app.py keep its T2
                text = REPO_APP[:cursor] + "    x = q"[:k + 1] + REPO_APP[cursor:]
                change(c, app, k + 2, text)
                out = complete(c, app, cursor + k + 1)
                assert out["context"]["repo"] == with_t2 and out["tokens"]["cached"] >= with_t2["tokens"]
                assert out["reanchor"] != "repo_context"
            # Where the editor's language server resolved a name: lerp joins T1, in idle time.
            lerp = REPO_UTIL[:REPO_UTIL.index("def lerp")].count("\n")
            res = c.call("definitions", {"path": str(app), "definitions": [
                {"path": str(util), "line": lerp}, {"path": "/elsewhere/x.py", "line": 3}]})
            assert res == {"path": str(app), "definitions": 1}
            idle(c)
            out = complete(c, app, cursor + len("    x = q"))
            assert out["reanchor"] == "repo_context" and out["context"]["repo"]["t1_tokens"] > lead["t1_tokens"]
            # Bad definitions: one-line errors, and the daemon serves on.
            for params in ({"path": str(app), "definitions": "x"}, {"path": str(app), "definitions": [3]},
                           {"path": str(app), "definitions": [{"path": str(util), "line": -1}]},
                           {"path": str(app), "definitions": [{"path": str(util), "line": 1}] * 257},
                           {"path": str(repo / "closed.py"), "definitions": []}):
                with pytest.raises(InvalidParams) as err:
                    c.call("definitions", params)
                assert "\n" not in str(err.value), params
            assert complete(c, app, cursor)["text"] is not None
    finally:
        d.stop()
