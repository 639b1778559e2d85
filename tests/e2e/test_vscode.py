"""The VS Code extension in a real VS Code: code-server with editors/vscode/efim.vsix installed, driven
by headless Chromium through Playwright, the extension running the repository's `efim lsp`, which
starts an isolated daemon on the tiny model. Type in a Python file, see efim's ghost text in the
editor's DOM, accept it with Tab and read the file back; then accept a next word (Ctrl+Right) and
check that the daemon heard of both accepts.

`make vscode` (part of `make test`) installs code-server, Chromium and builds the .vsix. The test
skips only when the browser cannot start.
"""

from __future__ import annotations

import json
import re
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from efim_local.errors import one_line

from tests.helpers import ROOT

CODE_SERVER = ROOT / ".cache" / "code-server" / "node_modules" / ".bin" / "code-server"
VSIX = ROOT / "editors" / "vscode" / "efim.vsix"
SOURCE = "def greet(name):\n    return 'hello ' + name\n\n\n"
GHOST = ".ghost-text-decoration, .ghost-text"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def vscode(request, tmp_path, tiny_model):
    """code-server on a free port with the extension installed; yields (url, workspace, socket).
    Indirect parametrization gives settings to change."""
    if not CODE_SERVER.exists() or not VSIX.exists():
        pytest.fail(f"{CODE_SERVER.name} or {VSIX.name} missing: run `make vscode`")
    ws, user, exts = tmp_path / "ws", tmp_path / "user", tmp_path / "exts"
    ws.mkdir()
    (ws / "app.py").write_text(SOURCE)
    sock = tmp_path / "run" / "efim.sock"
    (tmp_path / "config.toml").write_text("max_prompt_ms = 0\n")
    env = dict(os.environ, XDG_STATE_HOME=str(tmp_path / "state"), XDG_CACHE_HOME=str(tmp_path / "cache"),
               XDG_DATA_HOME=str(tmp_path / "data"), XDG_CONFIG_HOME=str(tmp_path / "config"),
               EFIM_CONFIG=str(tmp_path / "config.toml"), EFIM_MODEL=str(tiny_model), EFIM_SOCKET=str(sock),
               EFIM_LSP_LOG=str(tmp_path / "lsp.log"))
    (user / "User").mkdir(parents=True)
    (user / "User" / "settings.json").write_text(json.dumps({
        "efim.path": str(Path(sys.executable).parent / "efim"), "efim.socket": str(sock),
        "efim.maxTokens": 6, "efim.maxLines": 1, "efim.debounceMs": 0,
        # nothing else may take Tab, and nothing may pop up over the editor
        "editor.quickSuggestions": {"other": "off", "comments": "off", "strings": "off"},
        "editor.suggestOnTriggerCharacters": False, "editor.wordBasedSuggestions": "off",
        "editor.inlineSuggest.enabled": True, "editor.autoClosingBrackets": "never",
        "workbench.startupEditor": "none", "security.workspace.trust.enabled": False,
        "workbench.tips.enabled": False, "extensions.ignoreRecommendations": True,
        "telemetry.telemetryLevel": "off", "update.mode": "none", "files.autoSave": "off",
        **getattr(request, "param", {})}))
    base = [str(CODE_SERVER), "--user-data-dir", str(user), "--extensions-dir", str(exts)]
    inst = subprocess.run([*base, "--install-extension", str(VSIX)], env=env, capture_output=True, text=True,
                          timeout=120)
    assert inst.returncode == 0, inst.stdout + inst.stderr
    port = free_port()
    log = open(tmp_path / "code-server.log", "wb")
    proc = subprocess.Popen([*base, "--auth", "none", "--bind-addr", f"127.0.0.1:{port}", "--disable-telemetry",
                             "--disable-update-check", "--disable-workspace-trust", "--disable-getting-started-override",
                             str(ws)], env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/?folder={ws}"
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "code-server.log").read_text()
            time.sleep(0.2)
    try:
        yield url, ws, sock
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
        from efim_local.daemon.client import Client

        if sock.exists():  # the daemon that `efim lsp` started
            try:
                with Client(sock, timeout=10) as c:
                    c.call("shutdown")
            except OSError:
                pass


@pytest.fixture
def page(vscode):
    """Headless Chromium on code-server's workbench; skips only when the browser cannot start."""
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium is not installed (make vscode installs it)")
    with sync_playwright() as p:
        try:
            browser = p.chromium.launch(executable_path=chromium, headless=True,
                                        args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        except Exception as e:  # noqa: BLE001 - the one reason to skip
            pytest.skip(f"chromium cannot start: {one_line(str(e))[:200]}")
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(vscode[0])
            page.wait_for_selector(".monaco-workbench .part.statusbar", timeout=60_000)
            yield page
        finally:
            browser.close()


def daemon_accepted(sock: Path) -> dict:
    from efim_local.daemon.client import Client

    with Client(sock, timeout=10) as c:
        return c.call("status")["accepted"]


def wait_ghost(page, tmp_path: Path):
    """The ghost text element; on a timeout, a screenshot and the extension's logs explain why."""
    from playwright.sync_api import TimeoutError

    try:
        return page.wait_for_selector(GHOST, timeout=60_000)
    except TimeoutError:
        page.screenshot(path=str(tmp_path / "no-ghost.png"))
        logs = [f"{p}:\n{p.read_text(errors='replace')[-3000:]}" for p in (tmp_path / "user" / "logs").rglob("*.log")
                if "efim" in p.name.lower() or "exthost" in p.name.lower()]
        if (tmp_path / "lsp.log").exists():
            logs.append("efim lsp: " + (tmp_path / "lsp.log").read_text(errors="replace")[-3000:])
        pytest.fail("no ghost text; screenshot in " + str(tmp_path / "no-ghost.png") + "\n" + "\n".join(logs))


def open_app_at_its_end(page, name: str = "app.py") -> None:
    """Open ``name`` once the extension is ready (its language client is up, its provider registered,
    when its status-bar item says so), with the cursor at the end."""
    page.wait_for_selector(".statusbar-item:has-text('efim: ready')", timeout=60_000)
    page.keyboard.press("Control+P")
    page.wait_for_selector(".quick-input-widget input", timeout=20_000)
    page.keyboard.type(name)
    page.wait_for_selector(".quick-input-list .monaco-list-row", timeout=20_000)
    page.keyboard.press("Enter")
    page.wait_for_selector(".monaco-editor .view-line", timeout=20_000)
    page.click(".monaco-editor .view-lines")
    page.keyboard.press("Control+End")


def test_ghost_text_tab_and_next_word_in_code_server(vscode, page, tmp_path):
    url, ws, sock = vscode
    open_app_at_its_end(page)
    page.keyboard.type("x = gre", delay=30)
    ghost = wait_ghost(page, tmp_path)
    page.wait_for_timeout(300)  # let the suggestion settle before reading it
    shown = "".join(e.text_content() for e in page.query_selector_all(GHOST)).replace("\u00a0", " ")
    assert shown.strip(), "empty ghost text"
    assert ghost.is_visible()
    page.keyboard.press("Tab")
    page.keyboard.press("Control+S")
    deadline = time.monotonic() + 20
    while (ws / "app.py").read_text() == SOURCE and time.monotonic() < deadline:
        time.sleep(0.1)
    saved = (ws / "app.py").read_text()
    assert saved.startswith(SOURCE + "x = gre")
    inserted = saved[len(SOURCE + "x = gre"):]
    assert inserted == shown, (inserted, shown)  # Tab inserted exactly the ghost text
    # the status bar shows the last latency, the context the answer used and the cache tier
    item = page.locator(".statusbar-item:has-text('efim')").first.text_content()
    assert "ms" in item and re.search(r"\d+/\d+ ctx \(\d+%(, reduced)?\)", item), item
    deadline = time.monotonic() + 10
    while daemon_accepted(sock)["completions"] < 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert daemon_accepted(sock)["completions"] == 1  # the item's efim.accepted command ran

    # next word: a new line, a new ghost, Ctrl+Right takes its first word
    page.keyboard.press("End")
    page.keyboard.press("Enter")
    page.keyboard.type("y = gre", delay=30)
    wait_ghost(page, tmp_path)
    page.wait_for_timeout(300)
    page.keyboard.press("Control+ArrowRight")
    deadline = time.monotonic() + 10
    while daemon_accepted(sock)["partial"] < 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    acc = daemon_accepted(sock)
    assert acc["partial"] + acc["completions"] >= 2 and acc["accepted_chars"] > len(inserted), acc


# Counts the times the ghost text leaves the editor's DOM (a flicker) from now on.
WATCH_GHOST = """(sel) => {
  window.__ghostGone = 0;
  let shown = document.querySelectorAll(sel).length > 0;
  new MutationObserver(() => {
    const now = document.querySelectorAll(sel).length > 0;
    if (shown && !now) window.__ghostGone += 1;
    shown = now;
  }).observe(document.body, { childList: true, subtree: true, characterData: true });
}"""


def ghost_text(page) -> str:
    return "".join(e.text_content() for e in page.query_selector_all(GHOST)).replace("\u00a0", " ")


def test_typing_the_ghost_keeps_it_and_tab_inserts_the_rest(vscode, page, tmp_path):
    """Typing the ghost's next characters keeps it shown (never leaves the DOM: no flicker) while
    the daemon answers from what it generated; Tab inserts the rest."""
    url, ws, sock = vscode
    open_app_at_its_end(page)
    for prefix in ("x = gre", "y = na", "z = ret", "w = hel"):
        page.keyboard.type(prefix, delay=30)
        wait_ghost(page, tmp_path)
        page.wait_for_timeout(300)
        shown = ghost_text(page)
        chars = shown[:2]
        if len(shown.strip()) > 3 and chars.isascii() and chars.isprintable() and chars.strip():
            break
        page.keyboard.press("Escape")
        page.keyboard.press("End")
        page.keyboard.press("Enter")
    else:
        pytest.fail("no ghost began with characters to type")
    page.evaluate(WATCH_GHOST, GHOST)
    page.keyboard.type(chars, delay=80)
    page.wait_for_timeout(300)
    assert page.evaluate("window.__ghostGone") == 0, "the ghost left while its characters were typed"
    rest = ghost_text(page)
    assert rest and (shown[2:].startswith(rest) or rest.startswith(shown[2:])), (shown, rest)
    page.keyboard.press("Tab")
    page.keyboard.press("Control+S")
    deadline = time.monotonic() + 20
    while prefix not in (ws / "app.py").read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    saved = (ws / "app.py").read_text()
    assert prefix + chars + rest in saved, (saved, chars, rest)
    from efim_local.daemon.client import Client

    with Client(sock, timeout=10) as c:
        sources = c.call("status")["requests"]["sources"]
    assert sources["type-through"] + sources["accept"] >= 1, sources


def test_definitions_of_imported_names_reach_the_daemon(vscode, page, tmp_path):
    """VS Code's own JavaScript features resolve the name a file imports ("go to definition"); the
    extension sends the place in the other file to efim (repository context), through `efim lsp`."""
    url, ws, sock = vscode
    (ws / "util.js").write_text("export function clamp(value, low, high) {\n"
                                "  return Math.max(low, Math.min(high, value));\n}\n")
    (ws / "main.js").write_text("import { clamp } from './util.js';\n\nconsole.log(clamp(5, 0, 1));\n")
    open_app_at_its_end(page, "main.js")
    from efim_local.daemon.client import Client

    deadline, seen = time.monotonic() + 90, {}
    while time.monotonic() < deadline:  # (the TypeScript server starts first)
        with Client(sock, timeout=10) as c:
            seen = c.call("status")["definitions"]
        if seen["locations"] >= 1:
            break
        page.keyboard.press("Control+S")  # a save sends them again (if the first try found none)
        time.sleep(1)
    assert seen["locations"] >= 1, seen


def test_where_the_cursor_settles_is_prefilled_before_the_first_keystroke(vscode, page, tmp_path):
    """In a file bigger than a slot, the cursor goes to line 1202 (Ctrl+G) and stays: the extension
    tells efim (``efim/cursor``), which prefills the plan anchored there, so that the first request on
    that line finds it cached (what opening the file prefilled does not hold it)."""
    from efim_local.daemon.client import Client

    url, ws, sock = vscode
    big = ws / "big.py"
    big.write_text("".join(f"def f{i}(x):\n    return x * {i}\n\n\n" for i in range(400)))  # ~8,000 tokens
    open_app_at_its_end(page, "big.py")

    def slots(after=None, timeout=120.0):  # the file's slots once idle (and not ``after``)
        deadline, got = time.monotonic() + timeout, None
        while time.monotonic() < deadline:
            with Client(sock, timeout=10) as c:
                st = c.call("status")
            got = sorted(s["tokens"] for s in st["slots"] if s["path"] == str(big))
            if st["idle_tasks"] == 0 and got and got != after:
                return got
            time.sleep(0.3)
        return got

    # Opening it prefilled its top, and the cursor that came to rest at its end the plan there
    # (after efim.cursorDebounceMs): both done before the cursor moves on.
    page.wait_for_timeout(1500)
    top = slots()
    page.keyboard.press("Control+G")
    page.wait_for_selector(".quick-input-widget input", timeout=20_000)
    page.keyboard.type("1202")
    page.keyboard.press("Enter")
    there = slots(after=top)
    with Client(sock, timeout=30) as c:
        out = c.call("complete", {"path": str(big), "position": {"line": 1201, "character": 0}, "max_tokens": 2})
    assert out["reanchor"] is None and out["cache_tier"] == "slot" and out["tokens"]["evaluated"] <= 2, (out, top,
                                                                                                          there)


@pytest.mark.parametrize("vscode", [{"efim.path": "/nonexistent/bin/efim"}], indirect=True)
def test_missing_efim_gets_a_clear_message(vscode, page):
    toast = page.wait_for_selector(".notifications-toasts :text('was not found')", timeout=60_000)
    assert "/nonexistent/bin/efim" in toast.text_content() and "efim.path" in toast.text_content()
    assert page.locator(".statusbar-item:has-text('efim: not found')").count() == 1


@pytest.mark.parametrize("vscode", [{"editor.autoClosingBrackets": "always", "efim.maxTokens": 8}], indirect=True)
def test_a_ghost_that_types_over_the_auto_closed_bracket_replaces_it(vscode, page, tmp_path):
    """VS Code's auto-closing puts ``)`` after ``name(``. A completion that goes on past it comes with a
    range over that ``)`` (the daemon's ``replaces``): Tab leaves ``name(text)`` with one closer."""
    from efim_local.daemon.client import Client

    url, ws, sock = vscode
    open_app_at_its_end(page)
    line = SOURCE.count("\n")  # the cursor's line (0-based)
    for name in ("print", "len", "str", "int", "sorted", "list", "range", "open", "max", "repr", "getattr", "set",
                 "dict", "min", "sum", "isinstance", "tuple", "any"):
        page.keyboard.type(name + "(", delay=30)
        deadline = time.monotonic() + 15
        while not ghost_text(page).strip() and time.monotonic() < deadline:
            page.wait_for_timeout(100)
        page.wait_for_timeout(300)
        with Client(sock, timeout=30) as c:  # the same plan again: the daemon's answer (greedy: the same)
            res = c.call("complete", {"path": str(ws / "app.py"), "position": {"line": line, "character": len(name) + 1},
                                      "type_over": True, "max_tokens": 8, "max_lines": 1})
        if res.get("replaces") and ghost_text(page).strip():
            break
        page.keyboard.press("Escape")
        page.keyboard.press("End")
        page.keyboard.press("Enter")
        line += 1
    else:
        pytest.fail("no answer typed over the auto-closed bracket")
    page.keyboard.press("Tab")
    page.keyboard.press("Control+S")
    want = name + "(" + res["text"]
    deadline = time.monotonic() + 20
    while want not in (ws / "app.py").read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert (ws / "app.py").read_text().split("\n")[line] == want, (res, (ws / "app.py").read_text())
