"""Repository context on small real projects the tests create (git init, files that import each other)."""

import ast
import os
import subprocess
from pathlib import Path

import pytest

import efim_local
from efim_local.prompt.repo_format import FORMATS, Piece, render, repo_format, text_of, tokenize_segments
from efim_local.prompt.templates import Template
from efim_local.repo import Limits, RepoContext, Tier, TierLimits, TierStore, discover
from efim_local.repo.parse import parse_file

MODELS = '''"""Models."""


class User:
    """A user of the shop."""

    def __init__(self, name: str):
        self.name = name

    def greet(self) -> str:
        return "hi " + self.name


def make_user(name: str) -> User:
    return User(name)


def _private():
    pass
'''
UTIL = "def slugify(text: str) -> str:\n    return text.lower().replace(' ', '-')\n"
APP = "from pkg.models import User\n\n\ndef main():\n    u = User('a')\n    return u.greet()\n"


def git(root, *args):
    subprocess.run(["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True,
                   capture_output=True)


def write(root: Path, files: dict[str, str]):
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


@pytest.fixture
def project(tmp_path):
    root = tmp_path / "shop"
    write(root, {"pkg/__init__.py": "from .models import User\n", "pkg/models.py": MODELS, "pkg/util.py": UTIL,
                 "app.py": APP, ".gitignore": "secret.py\nbuild/\n", "secret.py": "class Secret:\n    pass\n",
                 "build/gen.py": "def generated():\n    pass\n"})
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "init")
    return root


def test_discovery_respects_gitignore_and_lists_untracked_files(project):
    (project / "new.py").write_text("def fresh():\n    pass\n")
    found = discover(project, suffixes=(".py",))
    assert found.source == "git"
    assert found.files == ["app.py", "new.py", "pkg/__init__.py", "pkg/models.py", "pkg/util.py"]
    t0 = RepoContext(project).t0()
    assert "Secret" not in t0.to_json() and "generated" not in t0.to_json() and "fresh" in t0.to_json()


def test_t0_is_a_small_deterministic_map(project):
    a, b = RepoContext(project).t0(), RepoContext(project).t0()
    assert a == b and a.digest == b.digest
    models = {p.path: p.text for p in a.pieces}["pkg/models.py"]
    assert models == "class User: ...\ndef make_user(name: str) -> User: ...\n"  # public top-level headers only
    assert [p.path for p in a.pieces] == sorted(p.path for p in a.pieces)


def test_t1_holds_the_imported_definitions_the_file_uses(project):
    ctx = RepoContext(project)
    t1 = ctx.t1("app.py", APP)
    assert [p.path for p in t1.pieces] == ["pkg/models.py"]
    text = t1.pieces[0].text
    assert text.startswith('class User:\n    """A user of the shop."""')
    assert "    def greet(self) -> str: ..." in text and "slugify" not in text


def test_an_import_added_changes_t1_and_not_t0(project):
    ctx = RepoContext(project)
    t0, t1 = ctx.t0(), ctx.t1("app.py", APP)
    edited = "from pkg.util import slugify\n" + APP + "\n\ndef slug(x):\n    return slugify(x)\n"
    t1b = ctx.t1("app.py", edited)
    assert t1b.digest != t1.digest
    assert [p.path for p in t1b.pieces] == ["pkg/models.py", "pkg/util.py"]
    assert "def slugify(text: str) -> str:" in t1b.pieces[1].text
    # An import that is not used adds nothing.
    assert ctx.t1("app.py", "from pkg.util import slugify\n" + APP).digest == t1.digest
    # Saving app.py with a new function changes T0 only by that definition.
    (project / "app.py").write_text(edited)
    assert ctx.saved("app.py", edited.encode())
    assert ctx.t0().digest != t0.digest and "def slug(x): ..." in ctx.t0().to_json()


def test_t0_digest_changes_only_when_definitions_change(project):
    ctx = RepoContext(project)
    t0 = ctx.t0()
    body_edit = MODELS.replace("    return User(name)", "    user = User(name)\n    return user")
    ctx.saved("pkg/models.py", body_edit.encode())
    assert ctx.t0().digest == t0.digest
    sig_edit = body_edit.replace("def make_user(name: str)", "def make_user(name: str, admin: bool = False)")
    assert ctx.saved("pkg/models.py", sig_edit.encode())
    assert ctx.t0().digest != t0.digest


def test_a_renamed_file_appears_under_its_new_path(project):
    live = RepoContext(project)  # indexed before the rename
    git(project, "mv", "pkg/util.py", "pkg/text.py")
    app = "from pkg.text import slugify\n\n\ndef f():\n    return slugify('A b')\n"
    (project / "app.py").write_text(app)
    ctx = RepoContext(project)
    assert [p.path for p in ctx.t1("app.py", app).pieces] == ["pkg/text.py"]
    paths = [p.path for p in ctx.t0().pieces]
    assert "pkg/text.py" in paths and "pkg/util.py" not in paths
    # The same rename reported through saves to a live index.
    live.saved("pkg/util.py", None)
    assert live.t1("app.py", app).pieces == ()
    live.saved("pkg/text.py", UTIL.encode())
    assert [p.path for p in live.t1("app.py", app).pieces] == ["pkg/text.py"]


def test_limits_are_honoured(project):
    (project / "big.py").write_text("X = 1\n" * 20_000)
    found = discover(project, Limits(max_file_bytes=10_000), (".py",))
    assert "big.py" not in found.files and found.skipped["max_file_bytes"] == 1
    found = discover(project, Limits(max_files=2), (".py",))
    assert found.files == ["app.py", "big.py"] and found.skipped["max_files"] == 3
    found = discover(project, Limits(max_total_bytes=len(APP) + 30), (".py",))
    assert found.files == ["app.py", "pkg/__init__.py"]
    assert discover(project, Limits(max_seconds=0), (".py",)).files == []
    for i in range(40):
        write(project, {f"m{i:02}.py": "\n".join(f"def function_number_{k}(a, b):\n    pass" for k in range(30))})
    tl = TierLimits(t0_chars=600, t1_chars=200, t1_snippet_chars=150)
    ctx = RepoContext(project, tier_limits=tl)
    assert 0 < ctx.t0().chars <= 600
    assert ctx.t1("app.py", APP).chars <= 200


@pytest.mark.parametrize("use_git", [True, False])
def test_a_symlink_out_of_the_root_is_ignored(tmp_path, use_git):
    outside = tmp_path / "outside"
    write(outside, {"leak.py": "def leaked():\n    pass\n"})
    root = tmp_path / "proj"
    write(root, {"a.py": "def a():\n    pass\n"})
    os.symlink(outside / "leak.py", root / "link.py")
    os.symlink(outside, root / "linkdir")
    os.symlink(root / "a.py", root / "inner.py")  # inside the root: allowed
    if use_git:
        git(root, "init", "-q")
        git(root, "add", "-A")
    found = discover(root, suffixes=(".py",))
    assert found.source == ("git" if use_git else "walk")
    assert found.files == ["a.py", "inner.py"] and found.skipped.get("outside_root") == 1
    assert "leaked" not in RepoContext(root).t0().to_json()


@pytest.mark.parametrize("use_git", [True, False])
def test_a_file_name_that_is_not_utf8_is_left_out_not_the_whole_context(tmp_path, use_git, caplog):
    """Issue 38: one tracked file named b"caf\\xe9_\\xff.py" made every tier fail to encode
    (UnicodeEncodeError on each request: no repository context at all for the project)."""
    root = tmp_path / "proj"
    write(root, {"a.py": "def alpha():\n    pass\n"})
    with open(os.path.join(os.fsencode(root), b"caf\xe9_\xff.py"), "wb") as f:
        f.write(b"def beta():\n    pass\n")
    if use_git:
        git(root, "init", "-q")
        git(root, "add", "-A")
    caplog.set_level("INFO", "efim.repo")
    found = discover(root, suffixes=(".py",))
    assert found.source == ("git" if use_git else "walk")
    assert found.files == ["a.py"] and found.skipped == {"name_not_utf8": 1}
    assert [r.getMessage() for r in caplog.records] == [f"{root}: left out 1 file(s) whose name is not UTF-8"]
    ctx = RepoContext(root)
    assert [p.path for p in ctx.t0().pieces] == ["a.py"] and "alpha" in ctx.t0().to_json()
    # A file saved under such a name later (the watcher) stays out too.
    assert not ctx.saved("caf\udce9.py", b"def gamma():\n    pass\n")
    assert "gamma" not in ctx.t0().to_json() and ctx.t1("a.py", "import caf\n").digest


def test_the_fallback_walk_honours_the_root_gitignore(tmp_path):
    write(tmp_path, {"a.py": "def a():\n    pass\n", "gen_x.py": "def g():\n    pass\n", ".gitignore": "gen_*.py\n",
                     "node_modules/m/index.js": "function m() {}\n", "out/o.py": "def o():\n    pass\n"})
    (tmp_path / ".gitignore").write_text("gen_*.py\nout/\n")
    found = discover(tmp_path, suffixes=(".py", ".js"))
    assert found.source == "walk" and found.files == ["a.py"]


def test_tiers_are_saved_and_restored_by_digest(project, tmp_path):
    t0 = RepoContext(project).t0()
    store = TierStore(tmp_path / "tiers")
    store.put(t0, key=str(project))
    assert store.get(t0.digest) == t0 and store.latest(str(project)) == t0
    (tmp_path / "tiers" / f"{t0.digest}.json").write_text(t0.to_json().replace("User", "Usr"))
    assert store.get(t0.digest) is None  # damaged: not restored
    assert store.get("../x") is None
    assert Tier.from_json(t0.to_json()) == t0


def test_javascript_typescript_and_go_imports_resolve(tmp_path):
    write(tmp_path, {
        "src/util.ts": "export function add(a: number, b: number): number {\n  return a + b;\n}\n"
                       "export class Box {\n  get(): number { return 1; }\n}\n",
        "src/main.ts": "import { add, Box as B } from './util';\nconst x = add(1, 2);\nnew B();\n",
        "go.mod": "module example.com/shop\n",
        "store/store.go": "package store\n\n// Get returns it.\nfunc Get(k string) string {\n\treturn k\n}\n",
        "cmd/main.go": 'package main\n\nimport "example.com/shop/store"\n\nfunc main() { store.Get("a") }\n'})
    ctx = RepoContext(tmp_path)
    ts = ctx.t1("src/main.ts", (tmp_path / "src/main.ts").read_text())
    assert [p.path for p in ts.pieces] == ["src/util.ts"]
    assert "export function add(a: number, b: number): number {" in ts.pieces[0].text and "get(): number" in \
        ts.pieces[0].text
    go = ctx.t1("cmd/main.go", (tmp_path / "cmd/main.go").read_text())
    assert [p.path for p in go.pieces] == ["store/store.go"] and "func Get(k string) string {" in go.pieces[0].text


def test_python_relative_and_reexported_imports(project):
    write(project, {"pkg/shop.py": "from . import util\nfrom .models import make_user as mk\nfrom pkg import User\n\n"
                                   "def f():\n    return util.slugify(mk('x').name), User\n"})
    ctx = RepoContext(project)
    text = text_of(ctx.segments(FORMATS["text"], "pkg/shop.py", ctx.t1("pkg/shop.py",
                                                                       (project / "pkg/shop.py").read_text())))
    assert "# file: pkg/models.py\nclass User:" in text and "def make_user(name: str) -> User:" in text
    assert "# file: pkg/util.py\ndef slugify" in text


def test_an_unparsable_or_unknown_file_yields_nothing():
    assert parse_file("x.py", b"def (:\n\x00\xff").definitions == ()  # a parse error: no definition invented
    assert parse_file("notes.txt", b"def f(): pass").lang is None


class Vocab:
    bos = (1,)
    special = {"<|repo_name|>": 10, "<|file_sep|>": 11}

    def token_id(self, text):
        return self.special.get(text)

    def tokenize(self, text, special=False):
        return [ord(c) + 100 for c in text]

    def fim_ids(self):
        return {}


def test_qwen_repository_format_and_plain_text_fallback():
    pieces = [Piece("pkg/a.py", "def a(): ...")]
    qwen = render(FORMATS["qwen"], "shop", [pieces], "app.py")
    assert text_of(qwen) == "<|repo_name|>shop\n<|file_sep|>pkg/a.py\ndef a(): ...\n<|file_sep|>app.py\n"
    plain = render(FORMATS["text"], "shop", [pieces, [Piece("web/x.ts", "function x()")]], "app.py")
    assert text_of(plain) == ("# repository: shop\n# file: pkg/a.py\ndef a(): ...\n\n"
                              "// file: web/x.ts\nfunction x()\n\n# file: app.py\n")
    toks = tokenize_segments(render(FORMATS["qwen"], "s", [[Piece("a", "<|file_sep|>")]], "b"), Vocab())
    assert toks.count(11) == 2  # a file's text never becomes a marker token
    fam = Template(markers=None, stop_tokens=frozenset(), stop_strings=(), source="family:qwen")
    assert repo_format(fam).name == "qwen" and repo_format(None, Vocab()).name == "qwen"
    text = Template(markers=None, stop_tokens=frozenset(), stop_strings=(), source="text")
    assert repo_format(text, Vocab()).name == "text" and repo_format().name == "text"


def test_the_repo_package_stays_below_the_engine():
    pkg = Path(efim_local.__file__).parent / "repo"
    banned = ("engine", "daemon", "lsp", "cli", "bench", "training")
    for f in pkg.glob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom):
                mod = node.module or ""
                top = mod.split(".")[0] if node.level == 2 else mod.split(".")[1] if mod.startswith("efim_local.") \
                    else ""
                assert top not in banned, (f.name, mod)
