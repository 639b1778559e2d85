"""The engine is closed (issue 40): no module-level function in efim_local/engine/ takes the engine
as its first parameter. What an engine does is a method of the engine or of an object it builds and
owns (``engine.growth``, ``engine.runner``, ``engine.status_report``, ...), never a free function
that reaches into it. Read from the source (AST), nothing imported."""

import ast
import re
from pathlib import Path

import efim_local.engine

ENGINE = Path(efim_local.engine.__file__).resolve().parent


def engine_first(path: Path) -> list[str]:
    """``file:line name`` of each module-level function of ``path`` whose first parameter is ``engine``."""
    out = []
    for node in ast.parse(path.read_text("utf-8"), str(path)).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            params = [*node.args.posonlyargs, *node.args.args]
            if params and params[0].arg == "engine":
                out.append(f"{path.name}:{node.lineno} {node.name}")
    return out


def test_no_module_function_in_the_engine_takes_the_engine_first():
    files = sorted(ENGINE.rglob("*.py"))
    assert len(files) > 20  # (the package was found)
    found = [hit for path in files for hit in engine_first(path)]
    assert not found, ("functions that take the engine as their first parameter; make them methods of an "
                       f"object the engine owns: {found}")


def test_the_check_finds_such_a_function(tmp_path):
    src = tmp_path / "mod.py"
    src.write_text("def grow(engine, path):\n    pass\n\n\nclass C:\n    def m(self, engine):\n        pass\n\n\n"
                   "def other(e, engine=None):\n    pass\n")
    assert engine_first(src) == ["mod.py:1 grow"]


def test_the_engine_asks_its_backend_not_whether_it_has_replicas():
    """Where prompts are decoded is the engine's ``backend`` (engine/backends.py), which the parts that
    differ with replicas ask; no module branches on whether the engine has a pool of replicas."""
    found = [f"{path.name}:{i}" for path in sorted(ENGINE.rglob("*.py"))
             for i, line in enumerate(path.read_text("utf-8").splitlines(), 1)
             if "remote is None" in line or "remote is not None" in line or "engine.remote" in line]
    assert not found, f"branches on the engine's replicas; ask engine.backend instead: {found}"


# The engine and the parts it builds: each changes its own state only (its methods), never another's
# attributes from outside (no hooks or components swapped after construction: issue 40).
PARTS = {"engine", "eng", "decoder", "planner", "tokenizer", "scheduler", "runner", "growth", "reuse", "backend",
         "ctx", "model", "instant", "trail", "pace", "speed", "cores", "files", "store", "repo", "repo_build",
         "status_report", "worker", "server"}


# A line that may assign to a part's attribute (``engine.x =``, ``self.decoder.n +=``, ``a, engine.x =``).
WRITE = re.compile(r"\b(?:%s)\.\w+\s*(?:[-+*/|&]?=(?!=)|,)" % "|".join(sorted(PARTS)))


def foreign_writes(path: Path) -> list[str]:
    """``file:line owner.attr`` of each assignment to an attribute of an object named as one of ``PARTS``
    (not ``self``'s own)."""
    out = []
    src = path.read_text("utf-8")
    if not WRITE.search(src):  # (parsing every serving file took half a second of the unit tier)
        return out
    for node in ast.walk(ast.parse(src, str(path))):
        targets = node.targets if isinstance(node, ast.Assign) else (
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
        while targets:
            t = targets.pop()
            if isinstance(t, (ast.Tuple, ast.List)):
                targets.extend(t.elts)
            elif isinstance(t, ast.Attribute):
                owner = t.value
                name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", None)
                if name in PARTS:
                    out.append(f"{path.name}:{node.lineno} {name}.{t.attr}")
    return out


# lsp/stdio.py's start_io stands in for pygls' LanguageServer.start_io, and sets what pygls' shutdown reads.
PYGLS = ("stdio.py", "server._stop_event")


def test_nothing_assigns_to_the_engines_parts_from_outside():
    serving = [p for p in sorted(ENGINE.parent.rglob("*.py")) if "training" not in p.parts]
    found = [hit for path in serving for hit in foreign_writes(path)
             if not (hit.startswith(PYGLS[0] + ":") and hit.endswith(" " + PYGLS[1]))]
    assert not found, f"assignments to another object's attributes (give it a method): {found}"


def test_the_write_check_finds_them(tmp_path):
    src = tmp_path / "mod.py"
    src.write_text("def f(self, engine, slot):\n    self.x = 1\n    slot.phase = 2\n    engine.speed = 3\n"
                   "    self.engine.active_at, y = 4, 5\n    self.decoder.n += 1\n")
    assert foreign_writes(src) == ["mod.py:4 engine.speed", "mod.py:5 engine.active_at", "mod.py:6 decoder.n"]
