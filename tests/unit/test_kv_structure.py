"""kv/ stays composed (issue 22, item 4): no module over 400 lines, no import cycle among its modules,
and the store takes what it needs from above (the shrink function) at construction."""

import ast
import inspect
from pathlib import Path

from efim_local.kv import StateStore

KV = Path(__file__).resolve().parents[2] / "efim_local" / "kv"


def _module(f: Path) -> str:
    parts = f.with_suffix("").relative_to(KV.parent).parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    """kv module -> the kv modules it imports at any level (relative imports resolved)."""
    out = {}
    for f in KV.rglob("*.py"):
        name = _module(f)
        pkg = name.split(".") if f.name == "__init__.py" else name.split(".")[:-1]
        deps = set()
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = ".".join(pkg[:len(pkg) - node.level + 1] + ([node.module] if node.module else []))
                deps |= {f"{base}.{a.name}" for a in node.names} if node.module is None else {base}
        out[name] = {d for d in deps if d == "kv" or d.startswith("kv.")}
    return out


def test_no_kv_module_is_over_400_lines():
    long = {_module(f): n for f in KV.rglob("*.py") if (n := len(f.read_text().splitlines())) > 400}
    assert not long


def test_no_import_cycle_inside_kv():
    graph = _imports()
    graph = {m: {d for d in deps if d in graph} for m, deps in graph.items()}  # modules, not names

    def reach(start):
        seen, todo = set(), list(graph[start])
        while todo:
            m = todo.pop()
            if m not in seen:
                seen.add(m)
                todo.extend(graph[m])
        return seen

    cycles = sorted(m for m in graph if m != "kv" and m in reach(m))
    assert not cycles, f"modules on an import cycle: {cycles}"


def test_the_shrink_function_is_passed_when_the_store_opens():
    assert "shrink" in inspect.signature(StateStore.open).parameters
    assert "shrink" in inspect.signature(StateStore).parameters
