"""The Neovim plugin's help file (editors/nvim/doc/efim.txt) documents every option in the Lua
config table and every user command, like test_docs.py does for the CLI."""

from __future__ import annotations

import re
from pathlib import Path

NVIM = Path(__file__).resolve().parents[2] / "editors" / "nvim"
HELP = (NVIM / "doc" / "efim.txt").read_text("utf-8")


def options() -> list[str]:
    src = (NVIM / "lua" / "efim" / "init.lua").read_text("utf-8")
    table = re.search(r"^local defaults = \{\n(.*?)^\}", src, re.M | re.S).group(1)
    return re.findall(r"^  (\w+) = ", table, re.M)


def commands() -> list[str]:
    src = (NVIM / "plugin" / "efim.lua").read_text("utf-8")
    return re.findall(r'^cmd\("(\w+)"', src, re.M)


def tags() -> set[str]:
    return set(re.findall(r"\*([^*\s]+)\*", HELP))


def test_every_option_is_documented():
    names = options()
    assert {"socket", "max_tokens", "accept_word_key", "filetypes", "info"} <= set(names)  # the parse works
    missing = [n for n in names if f"efim-{n}" not in tags() or not re.search(rf"^{n}\s", HELP, re.M)]
    assert not missing, f"options without a *efim-NAME* entry in doc/efim.txt: {missing}"


def test_every_command_is_documented():
    names = commands()
    assert {"EfimEnable", "EfimDisable", "EfimToggle", "EfimComplete", "EfimDismiss"} <= set(names)
    missing = [n for n in names if f":{n}" not in tags()]
    assert not missing, f"commands without a *:Name* entry in doc/efim.txt: {missing}"


def test_links_point_to_tags():
    links = set(re.findall(r"\|(efim[^|\s]*|:Efim\w+)\|", HELP))
    assert links and not links - tags(), links - tags()


def test_lua_uses_vim_uv_when_there():
    for f in (NVIM / "lua").rglob("*.lua"):
        for line in f.read_text("utf-8").splitlines():
            assert "vim.loop" not in line or "vim.uv or vim.loop" in line, f"{f.name}: {line.strip()}"
