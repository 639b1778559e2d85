"""The docs against the code, without a model: the CLI reference (cog), tables, names and paths.

The examples that need a model (console sessions, protocol exchanges) are replayed by
tests/e2e/test_doc_examples.py.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import io
import re
import subprocess
import sys
import tokenize
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "native" / "README.md"]
COGGED = [p for p in DOCS if "[[[cog" in p.read_text("utf-8")]


# -- the CLI reference -------------------------------------------------------------------------
def test_cli_reference_is_current():
    """docs/cli.md is click's own help for every command (regenerate: .venv/bin/cog -r docs/cli.md)."""
    assert ROOT / "docs" / "cli.md" in COGGED
    names = [str(p.relative_to(ROOT)) for p in COGGED]
    r = subprocess.run([sys.executable, "-m", "cogapp", "--check", "--diff",
                        "--check-fail-msg=regenerate with: .venv/bin/cog -r " + " ".join(names), *names],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_cli_reference_covers_every_command():
    from efim_local.cli import helpdoc

    names = [name for name, _ in helpdoc.commands()]
    assert set(names) >= {"efim", "efim complete", "efim status", "efim serve", "efim daemon start",
                          "efim daemon stop", "efim daemon status", "efim daemon restart", "efim cache ls",
                          "efim cache stats", "efim cache gc", "efim cache clear", "efim bench",
                          "efim bench paced", "efim bench quality", "efim bench all"}
    text = (ROOT / "docs" / "cli.md").read_text("utf-8")
    assert re.findall(r"^## `(.+)`$", text, re.M) == names


def test_cli_reference_hides_hidden_options():
    from efim_local.cli import helpdoc

    hidden = {opt for _, ctx in helpdoc.commands() for p in ctx.command.params if getattr(p, "hidden", False)
              for opt in p.opts}
    assert "--config-stdin" in hidden  # the check below means something
    text = (ROOT / "docs" / "cli.md").read_text("utf-8")
    assert not [opt for opt in hidden if re.search(re.escape(opt) + r"\b", text)]


def all_options() -> set[str]:
    from efim_local.cli import helpdoc

    return {opt for _, ctx in helpdoc.commands() for p in ctx.command.params
            for opt in (*p.opts, *p.secondary_opts)}


def inline_code(path: Path) -> list[str]:
    """The `inline code` spans of a markdown file, outside fenced blocks."""
    text = re.sub(r"^```.*?^```", "", path.read_text("utf-8"), flags=re.M | re.S)
    return re.findall(r"`([^`\n]+)`", text)


# Options of other programs that the docs name: llama-server's, scripts/train.py's.
FOREIGN_OPTIONS = {"--cache-reuse", "--swa-full", "--fragment-rate", "--slot-save-path", "--cache-ram"}  # llama-server's


def test_options_named_in_docs_exist():
    """Every `--option` the prose names (alone or after `efim ...`) is an option of some command."""
    known = all_options() | {"--help"} | FOREIGN_OPTIONS
    missing = []
    for path in DOCS:
        for span in inline_code(path):
            if span.startswith(("--", "efim ")):
                for opt in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", span):
                    if opt not in known:
                        missing.append(f"{path.name}: `{span}`: {opt}")
    assert not missing, "options the docs name but no command has:\n" + "\n".join(missing)


# -- the protocol -------------------------------------------------------------------------------
def table(path: Path, heading: str) -> list[list[str]]:
    """The rows (cells) of the first table after ``heading``."""
    text = path.read_text("utf-8")
    rows = []
    for line in text[text.index(heading):].splitlines()[1:]:
        if line.startswith("|"):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif rows:
            break
    return [r for r in rows[1:] if not set("".join(r)) <= set("-: ")]  # without header and rule


def test_error_table_matches_errors_module():
    from efim_local import errors

    rows = table(ROOT / "docs" / "protocol.md", "## Errors")
    documented = {(int(code), name.strip("`")) for code, name, _ in rows}
    constants = {(v, k) for k, v in vars(errors).items() if k.isupper() and isinstance(v, int)}
    assert documented == constants
    classes = [c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.EfimError)]
    assert {c.code for c in classes} <= {code for code, _ in constants}


def test_every_method_is_documented():
    """protocol.md has a section for each method of the daemon, and none for a method it lacks."""
    from efim_local.daemon.handlers import Handlers

    text = (ROOT / "docs" / "protocol.md").read_text("utf-8")
    methods = text[text.index("## Methods"):text.index("## Errors")]
    headings = re.findall(r"^### (.+)$", methods, re.M)
    documented = {name for heading in headings for name in re.findall(r"`(\w+)`", heading)}
    assert documented == set(Handlers.table(Handlers.__new__(Handlers)))


def test_complete_params_table_matches_request():
    from efim_local.request import CompletionRequest

    rows = table(ROOT / "docs" / "protocol.md", "### `complete`")
    documented = {name for row in rows for name in re.findall(r"`(\w+)`", row[0])}
    real = {name for name, _, _ in CompletionRequest.options()} | {"path", "text", "position", "offset", "stream", "version"}
    assert documented == real


# -- configuration ------------------------------------------------------------------------------
def toml_blocks(path: Path) -> list[str]:
    return re.findall(r"^```toml\n(.*?)^```", path.read_text("utf-8"), flags=re.M | re.S)


def test_config_examples_load(tmp_path):
    """Every config.toml the docs show loads, with the values it shows."""
    from efim_local import config

    blocks = [b for p in DOCS for b in toml_blocks(p)]
    assert blocks
    for i, block in enumerate(blocks):
        f = tmp_path / f"{i}.toml"
        f.write_text(block)
        cfg = config.load(f)
        data = tomllib.loads(block)
        for k, v in {**data.pop("context", {}), **data}.items():
            where = cfg.context if k in config.ContextParams.__dataclass_fields__ else cfg
            assert getattr(where, k) == (tuple(v) if isinstance(v, list) else v), (k, block)  # lists: tuples


def test_config_keys_named_in_docs_exist():
    """`key = value` spans in the prose are config keys."""
    from efim_local import config

    keys = set(config.Config.__dataclass_fields__) | set(config.ContextParams.__dataclass_fields__)
    named = [m for p in DOCS for span in inline_code(p) for m in re.findall(r"^(\w+) = ", span)]
    assert named and not set(named) - keys


# -- names of modules and files -----------------------------------------------------------------
def python_prose(path: Path) -> str:
    """A Python file's docstrings and comments that name ``efim_local`` (what the checks below read;
    tokenizing only files with such a comment: ``tokenize`` is slow)."""
    src = path.read_text("utf-8")
    if "efim_local" not in src:
        return ""
    parts = [t.string for t in tokenize.generate_tokens(io.StringIO(src).readline)
             if t.type == tokenize.COMMENT] if re.search(r"#.*efim_local", src) else []
    todo = [ast.parse(src)]
    while todo:  # (statement lists only: a docstring belongs to a module, class or function, all statements)
        node = todo.pop()
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            parts.append(ast.get_docstring(node) or "")
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            todo.extend(getattr(node, field, None) or ())
    return "\n".join(parts)


def prose_sources() -> list[tuple[str, str]]:
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    out = []
    for name in files:
        path = ROOT / name
        if name.startswith("native/.cache") or not path.is_file():
            continue
        if name.endswith(".py"):
            out.append((name, python_prose(path)))
        elif name.endswith((".md", ".lua", ".sh", ".service", ".toml")) or name == "Makefile":
            out.append((name, path.read_text("utf-8")))
    return out


def resolves(dotted: str) -> bool:
    """A dotted name under efim_local: a module, then attributes of it."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        mod = ".".join(parts[:i])
        try:
            if importlib.util.find_spec(mod) is None:
                continue
        except ModuleNotFoundError:
            continue
        if parts[i - 1] == "__main__":
            return i == len(parts)
        obj = importlib.import_module(mod)
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_module_references_resolve():
    """Docs, docstrings and comments name only modules, objects and files that exist."""
    bad = []
    for name, text in prose_sources():
        for ref in set(re.findall(r"\befim_local(?:\.[A-Za-z_]\w*)+", text)):
            if not resolves(ref):
                bad.append(f"{name}: {ref}")
        for ref in set(re.findall(r"\befim_local/[\w./-]*", text)):
            if not (ROOT / ref.rstrip(".")).exists():
                bad.append(f"{name}: {ref}")
    assert not bad, "references to modules or files that do not exist:\n" + "\n".join(sorted(bad))


OUTPUTS = ("bench-results/", "out/", "native/build/", "native/.cache/", "models/")  # what the docs' commands write


def test_relative_paths_in_docs_exist():
    """`dir/file.py`-like spans in the docs exist, from the repository, the package or the doc."""
    bad = []
    for path in DOCS:
        for span in inline_code(path):
            if not re.fullmatch(r"\w[\w.-]*/([\w.-]+/)*([\w-]+\.\w+|[\w.-]+/)", span) or span.startswith(OUTPUTS):
                continue
            if not any((base / span).exists() for base in (ROOT, ROOT / "efim_local", path.parent)):
                bad.append(f"{path.name}: {span}")
    assert not bad, "paths the docs name that do not exist:\n" + "\n".join(bad)


@pytest.mark.parametrize("ref,ok", [("efim_local.daemon.client.Client", True), ("efim_local.planner", False),
                                    ("efim_local.kv.events.Hit", True), ("efim_local.kv.nosuch", False)])
def test_resolves(ref, ok):
    assert resolves(ref) == ok
