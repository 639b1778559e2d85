"""The layers of efim_local, and the serving code never imports the training code.

LAYERS below is the one written order of the packages (docs/architecture.md draws it, and a test
here keeps the two the same): a module imports only from its own package and from packages in
lower layers, never from a peer in its own layer or from above. Every import statement counts, at
module level, inside functions and under ``if TYPE_CHECKING``: a lazy upward import is still a
dependency, it only fails later.

Everything under efim_local except training/, eval/ and bench/ serves completions: the library,
the engine, the daemon and the CLI. Only bench/ (and scripts/) may use training/; eval/ is checked
with the serving code, so it may not either. (The order puts training/ just above llama/, the one
package it needs; the order alone would let the layers above use it, this rule does not.)

One test imports every serving module in a fresh interpreter (a subprocess: this process has
imported who knows what); the others read every file's imports, including those inside
functions, which an import alone would not run.
"""

import ast
import functools
import json
import re
import subprocess
import sys
from pathlib import Path

import efim_local

PACKAGE = Path(efim_local.__file__).resolve().parent
OUTSIDE = ("training", "bench")  # the packages that are not serving code


def serving_files() -> list[Path]:
    return [p for p in sorted(PACKAGE.rglob("*.py")) if p.relative_to(PACKAGE).parts[0] not in OUTSIDE]


def module_name(path: Path, root: Path = PACKAGE) -> str:
    parts = ("efim_local", *path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_statements(path: Path):
    """Every import statement of ``path``, at any depth (in functions, classes, ``if``, ``try``, ...).
    Imports are statements: only statement lists are walked (ast.walk visits every expression too,
    ten times the nodes)."""
    todo = [ast.parse(path.read_text("utf-8"), str(path))]
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            todo.extend(getattr(node, field, None) or ())


@functools.cache  # three tests read every file
def imported_modules(path: Path, root: Path = PACKAGE) -> frozenset[str]:
    """Absolute names of every module an import statement in ``path`` may load."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in import_statements(path):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)  # `from . import training`
    return frozenset(out)


# -- the layers, low to high ------------------------------------------------------------------
# Each entry is one layer; a layer of two names holds two peers that may not import each other.
# "efim_local" is the package's own __init__ (the version).
LAYERS = (
    ("efim_local", "errors", "pins"),  # leaves: the version, the one error tree, pinned model part hashes
    ("request",),  # the completion request (position and options), checked once
    ("config",),  # configuration: dataclasses, config.toml, the environment
    ("llama", "ggufmeta"),  # llama.cpp handles, GGUF metadata keys; a GGUF metadata reader in pure Python
    ("training",),  # writes GGUF files for llama.cpp: knows llama's metadata keys, nothing that serves
    ("prompt",),  # documents, templates, the planner, token healing
    ("kv", "repo"),  # the KV state store; repository context (other files' tiers before this one)
    ("backend",),  # remote engines (llama-server, OpenAI-compatible): token arrays over HTTP
    ("engine",),  # the scheduler, runs, slots, reuse, models
    ("api", "catalog"),  # the library API; the model catalog
    ("download",),  # fetching a catalog model (efim models pull)
    ("daemon",),  # the socket, framing, dispatch, handlers, starting a daemon
    ("lsp",),  # efim lsp, relayed to the daemon
    ("eval",),  # answer quality (HumanEval infilling) and results files: below bench, whose suite runs it
    ("bench",),  # benchmarks: the only package that may use training (the tests below)
    ("cli",),  # the `efim` command, `efim bench` included
)
LAYER = {name: i for i, layer in enumerate(LAYERS) for name in layer}

# Imports that break the order today, each with the branch or issue that removes it.
KNOWN_UPWARD: set[tuple[str, str]] = set()  # {(file, package it imports)}


def unit(module: str) -> str | None:
    """The package (or top-level module) of efim_local that ``module`` belongs to; None outside."""
    parts = module.split(".")
    if parts[0] != "efim_local":
        return None
    return parts[1] if len(parts) > 1 and parts[1] in LAYER else "efim_local"


def upward_imports(root: Path = PACKAGE) -> dict[tuple[str, str], str]:
    """{(file, package it imports): why} for every import of a peer in the file's layer or of a
    package above it."""
    bad = {}
    for p in sorted(root.rglob("*.py")):
        src = unit(module_name(p, root))
        for dst in {unit(m) for m in imported_modules(p, root)} - {None, src}:
            if LAYER[dst] >= LAYER[src]:
                where = "a peer in its layer" if LAYER[dst] == LAYER[src] else "above it"
                bad[(str(p.relative_to(root)), dst)] = f"{src} imports {dst}, {where}"
    return bad


def test_every_package_has_a_layer():
    """A new package or top-level module gets its place in LAYERS (and in docs/architecture.md)."""
    names = {p.stem for p in PACKAGE.glob("*.py")} | {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert names - {"__init__"} == set(LAYER) - {"efim_local"}


def test_each_package_imports_only_packages_below_it():
    bad = upward_imports()
    assert {k: v for k, v in bad.items() if k not in KNOWN_UPWARD} == {}
    assert KNOWN_UPWARD <= set(bad), "an exception no longer needed: remove it from KNOWN_UPWARD"


def test_the_layer_check_sees_upward_imports(tmp_path):
    """(The layer check above would catch these: lazy, relative and type-only imports too.)"""
    pkg = tmp_path / "efim_local"
    for d in ("llama", "engine", "daemon"):
        (pkg / d).mkdir(parents=True)
    (pkg / "llama" / "x.py").write_text("def f():\n    from ..engine import Engine\n")
    (pkg / "engine" / "y.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                         "    import efim_local.daemon.server\nfrom ..llama import Model\n")
    (pkg / "daemon" / "z.py").write_text("from ..engine import Engine\nfrom .. import errors\n")
    (pkg / "api.py").write_text("from . import catalog\n")
    assert upward_imports(pkg) == {("llama/x.py", "engine"): "llama imports engine, above it",
                                   ("engine/y.py", "daemon"): "engine imports daemon, above it",
                                   ("api.py", "catalog"): "api imports catalog, a peer in its layer"}


def test_the_architecture_doc_draws_the_layers():
    """docs/architecture.md's tree lists LAYERS from the top down, peers on one line."""
    text = (PACKAGE.parent / "docs" / "architecture.md").read_text("utf-8")
    tree = text.split("```text\n", 1)[1].split("```", 1)[0]
    name = lambda n: "efim_local" if n == "__init__.py" else n.removesuffix("/").removesuffix(".py")
    drawn = [tuple(name(n) for n in re.match(r"\s*(.+?)(\s{2,}|$)", line)[1].split(", "))
             for line in tree.splitlines() if line.strip()]
    assert drawn == list(reversed(LAYERS))


# -- no two modules import each other -----------------------------------------------------------
# (A package's __init__ and its own modules do: the __init__ re-exports them, they import its names.)
KNOWN_MUTUAL: set[tuple[str, str]] = set()


def mutual_imports(root: Path = PACKAGE) -> set[tuple[str, str]]:
    graph = {module_name(p, root): imported_modules(p, root) for p in root.rglob("*.py")}
    own = lambda a, b: b == a.rpartition(".")[0] or a == b.rpartition(".")[0]  # a package and its module
    return {(a, b) for a in graph for b in graph[a] if a < b and b in graph and a in graph[b] and not own(a, b)}


def test_no_two_modules_import_each_other():
    pairs = mutual_imports()
    assert pairs - KNOWN_MUTUAL == set()
    assert KNOWN_MUTUAL <= pairs, "an exception no longer needed: remove it from KNOWN_MUTUAL"


# -- the serving code never imports the training code -------------------------------------------
def test_serving_files_do_not_import_training():
    files = serving_files()
    assert {module_name(p) for p in files} >= {"efim_local.engine.engine", "efim_local.daemon.server",
                                                "efim_local.cli.complete", "efim_local.kv.store"}
    bad = {str(p.relative_to(PACKAGE)): sorted(m for m in imported_modules(p) if m.startswith("efim_local.training"))
           for p in files}
    assert {f: m for f, m in bad.items() if m} == {}


def test_the_checker_sees_relative_and_nested_imports(tmp_path):
    """(The static check above would catch these.)"""
    pkg = tmp_path / "efim_local"
    (pkg / "daemon").mkdir(parents=True)
    f = pkg / "daemon" / "x.py"
    f.write_text("def f():\n    from ..training import bpe\n    from .. import training\n"
                 "import efim_local.training.corpus\n")
    assert imported_modules(f, pkg) >= {"efim_local.training", "efim_local.training.bpe", "efim_local.training.corpus"}


# (Not pkgutil.walk_packages: it imports every package, training/ too, to look inside.)
CHILD = """
import importlib, json, pkgutil, sys
import efim_local

names = []
def walk(path, prefix):
    for m in pkgutil.iter_modules(path, prefix):
        if m.name.split(".")[1] in {outside!r} or m.name.endswith("__main__"):
            continue
        mod = importlib.import_module(m.name)
        names.append(m.name)
        if m.ispkg:
            walk(mod.__path__, m.name + ".")
walk(efim_local.__path__, "efim_local.")
print(json.dumps({{"imported": names, "modules": sorted(sys.modules)}}))
"""


def test_importing_every_serving_module_loads_no_training_module():
    r = subprocess.run([sys.executable, "-c", CHILD.format(outside=OUTSIDE)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    expected = {module_name(p) for p in serving_files()} - {"efim_local", "efim_local.cli.__main__"}
    assert set(out["imported"]) == expected
    assert [m for m in out["modules"] if m.startswith("efim_local.training")] == []
    assert "torch" not in out["modules"]


def test_test_modules_do_not_import_each_other():
    """Shared test code lives in tests/helpers.py (and fixtures in tests/conftest.py), not in test modules."""
    tests = PACKAGE.parent / "tests"
    bad = {}
    for p in sorted(tests.rglob("test_*.py")):
        for node in import_statements(p):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or "", *(a.name for a in node.names)]
            hits = [n for n in names if n.rpartition(".")[2].startswith("test_") or n.endswith("conftest")]
            if hits:
                bad[str(p.relative_to(tests))] = hits
    assert bad == {}
