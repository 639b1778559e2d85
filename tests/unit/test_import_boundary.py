"""The serving code never imports the training code (torch, tokenizer training, GGUF writing).

Everything under efim_local except training/ and bench/ serves completions: the library, the
engine, the daemon and the CLI. Only bench/ (and scripts/) may use training/.

One test imports every serving module in a fresh interpreter (a subprocess: this process has
imported who knows what); the other reads every serving file's imports, including those inside
functions, which an import alone would not run.
"""

import ast
import json
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


def imported_modules(path: Path, root: Path = PACKAGE) -> set[str]:
    """Absolute names of every module an import statement in ``path`` may load."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text("utf-8"), str(path))):
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
    return out


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
        for node in ast.walk(ast.parse(p.read_text("utf-8"), str(p))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or "", *(a.name for a in node.names)] if isinstance(node, ast.ImportFrom) else []
            hits = [n for n in names if n.rpartition(".")[2].startswith("test_") or n.endswith("conftest")]
            if hits:
                bad[str(p.relative_to(tests))] = hits
    assert bad == {}
