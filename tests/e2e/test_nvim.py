"""The Neovim plugin in a real headless Neovim against a real daemon, driven over Neovim's RPC."""

import os
import shutil
import subprocess
import time

import pytest

from tests.helpers import ROOT, Daemon

pynvim = pytest.importorskip("pynvim")
pytestmark = pytest.mark.skipif(shutil.which("nvim") is None, reason="nvim is not installed (make test installs it)")


def wait_for(fn, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(0.02)
    return fn()


@pytest.fixture
def nvim_with_daemon(tmp_path, tiny_model):
    d = Daemon(tmp_path, tiny_model).start()
    listen = tmp_path / "nvim.sock"
    env = dict(os.environ, EFIM_SOCKET=str(d.sock))
    proc = subprocess.Popen(["nvim", "--headless", "-u", "NONE", "-i", "NONE", "--listen", str(listen),
                             "--cmd", f"set rtp+={ROOT / 'editors' / 'nvim'}"], env=env, cwd=ROOT,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert wait_for(listen.exists, 10)
    nvim = pynvim.attach("socket", path=str(listen))
    try:
        yield nvim, tmp_path
    finally:
        try:
            nvim.command("qa!")
        except Exception:
            pass
        proc.wait(10)
        d.stop()


def test_ghost_text_appears_and_accept_inserts(nvim_with_daemon):
    nvim, tmp = nvim_with_daemon
    src = tmp / "add.py"
    src.write_text("def add(a, b):\n\n\nprint(add(1, 2))\n")
    nvim.exec_lua('require("efim").setup({ debounce_ms = 30, max_tokens = 6, accept_key = "<C-y>" })')
    nvim.command(f"edit {src}")
    nvim.current.window.cursor = (2, 0)
    nvim.input("A    return a")  # typed like a user: insert mode, TextChangedI, debounce
    assert wait_for(lambda: nvim.current.line == "    return a")
    assert wait_for(lambda: nvim.exec_lua('return require("efim").visible()')), "no ghost text appeared"
    text = nvim.exec_lua('return require("efim").suggestion()')
    ns = nvim.exec_lua('return vim.api.nvim_get_namespaces()["efim"]')
    marks = nvim.exec_lua(f"return vim.api.nvim_buf_get_extmarks(0, {ns}, 0, -1, {{details = true}})")
    # (Neovim shows control characters of the random model's output as ^X, so compare lengths.)
    assert len(marks) == 1 and marks[0][1:3] == [1, len("    return a")] and marks[0][3]["virt_text"][0][0]
    assert nvim.api.get_mode()["mode"] == "i"

    nvim.input("<C-y>")  # accept
    lines = text.split("\n")
    assert wait_for(lambda: nvim.current.buffer[1] == "    return a" + lines[0])
    assert list(nvim.current.buffer[2:1 + len(lines)]) == lines[1:]
    assert not nvim.exec_lua('return require("efim").visible()')


def test_typing_again_dismisses_and_dismiss_key(nvim_with_daemon):
    nvim, tmp = nvim_with_daemon
    src = tmp / "m.py"
    src.write_text("import os\n\n")
    nvim.exec_lua('require("efim").setup({ debounce_ms = 30, max_tokens = 4 })')
    nvim.command(f"edit {src}")
    nvim.current.window.cursor = (2, 0)
    nvim.input("Ax = os.")
    assert wait_for(lambda: nvim.exec_lua('return require("efim").visible()'))
    nvim.input("<C-e>")  # dismiss
    assert wait_for(lambda: not nvim.exec_lua('return require("efim").visible()'))
    assert nvim.current.buffer[1] == "x = os."


def test_entering_a_file_and_moving_the_cursor_prefill_it(nvim_with_daemon):
    """didOpen on BufEnter and a cursor notification when the cursor settles: the first request on
    that line finds its plan cached."""
    from efim_local.daemon.client import Client

    nvim, tmp = nvim_with_daemon
    src = tmp / "big.py"
    src.write_text("".join(f"def f{i}(x):\n    return x * {i}\n\n\n" for i in range(100)))
    nvim.exec_lua('require("efim").setup({ debounce_ms = 30, max_tokens = 2, cursor_debounce_ms = 50 })')
    nvim.command(f"edit {src}")
    sock = os.environ.get("EFIM_SOCKET") or nvim.exec_lua('return os.getenv("EFIM_SOCKET")')
    with Client(sock) as c:
        assert wait_for(lambda: c.call("status")["documents"] == 1), "the buffer was not opened in the daemon"
        nvim.current.window.cursor = (201, 4)
        nvim.command("doautocmd CursorMoved")  # headless Neovim fires no cursor events by itself
        assert wait_for(lambda: c.call("status")["idle_tasks"] == 0 and any(
            s["path"] == str(src) and s["tokens"] > 500 for s in c.call("status")["slots"]))
        time.sleep(0.3)
        assert wait_for(lambda: c.call("status")["idle_tasks"] == 0)
        out = c.call("complete", {"path": str(src), "position": {"line": 200, "character": 4}, "max_tokens": 2})
    assert out["reanchor"] is None and out["cache_tier"] == "slot" and out["tokens"]["evaluated"] <= 2, out
