"""A project's symbols and how a file's imports resolve to other files of the project.

Resolution rules (no build system is read, no network, nothing outside the root):
- Python: ``a.b`` is the file ``a/b.py`` or ``a/b/__init__.py`` at any depth (``src/`` layouts),
  the shortest path winning; relative imports resolve from the importing file's package;
  ``from pkg import name`` finds ``name`` defined in the package, re-exported by it (followed up to
  3 hops), or the submodule ``pkg/name``.
- JavaScript/TypeScript: relative specifiers (``./x``, ``../y``) with the usual extensions and ``index``.
- Go: an import path whose tail names a project directory.
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass
from pathlib import Path

from .discover import Discovery, Limits, discover, utf8_name
from .parse import EXTENSIONS, Definition, FileSymbols, Import, parse_file

JS_EXTS = (".ts", ".tsx", ".js", ".jsx", ".mjs", ".cjs", ".mts", ".cts")


@dataclass(frozen=True)
class Target:
    """What a local name of a file refers to in the project: a definition, or a whole module."""

    path: str
    definition: Definition | None = None  # None: the name is a module (``import pkg.mod as m``)


class RepoIndex:
    """Parsed files of one project. ``build`` discovers and parses; ``update`` re-reads one file."""

    def __init__(self, root: str | os.PathLike, name: str | None = None, limits: Limits | None = None):
        self.root = Path(root)
        self.name = name or self.root.resolve().name
        self.limits = limits = limits or Limits()
        self.files: dict[str, FileSymbols] = {}
        self.discovery: Discovery | None = None
        self._modules: dict[str, list[str]] | None = None

    @classmethod
    def build(cls, root: str | os.PathLike, name: str | None = None, limits: Limits | None = None) -> RepoIndex:
        """Discover the project's source files under ``root`` and parse them (within ``limits``)."""
        index = cls(root, name, limits)
        limits = index.limits
        index.discovery = discover(root, limits, tuple(EXTENSIONS))
        for rel in index.discovery.files:
            try:
                data = (index.root / rel).read_bytes()[:limits.max_file_bytes]
            except OSError:
                continue
            index.files[rel] = parse_file(rel, data)
        return index

    def update(self, rel: str, source: bytes | None) -> bool:
        """Re-parse one file (an editor saved it; None: deleted). True when its definitions or imports
        changed, i.e. when tiers built from the index may change. A name that is not UTF-8 is left
        out, as discovery does."""
        if not utf8_name(rel):
            return False
        old = self.files.get(rel)
        if source is None:
            self.files.pop(rel, None)
            self._modules = None
            return old is not None
        new = parse_file(rel, source)
        self.files[rel] = new
        if old is None:
            self._modules = None
        return old is None or (old.definitions, old.imports) != (new.definitions, new.imports)

    # -- module resolution ---------------------------------------------------------------------------
    def modules(self) -> dict[str, list[str]]:
        """Python dotted name -> files, for every suffix of every file's package path."""
        if self._modules is None:
            mods: dict[str, list[str]] = {}
            for rel in self.files:
                if not rel.endswith((".py", ".pyi")):
                    continue
                parts = rel.rsplit(".", 1)[0].split("/")
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                for i in range(len(parts)):
                    mods.setdefault(".".join(parts[i:]), []).append(rel)
            for v in mods.values():
                v.sort(key=lambda p: (p.count("/"), p.endswith(".pyi"), p))
            self._modules = mods
        return self._modules

    def resolve_module(self, importer: str, imp: Import | str) -> str | None:
        """The project file a module name refers to, seen from ``importer``; None if outside the project."""
        module = imp.module if isinstance(imp, Import) else imp
        if importer.endswith((".py", ".pyi")):
            return self._py_module(importer, module)
        if importer.endswith(".go"):
            return self._go_package(module)
        return self._js_module(importer, module) if module.startswith(".") else None

    def _py_module(self, importer: str, module: str) -> str | None:
        if module.startswith("."):
            level = len(module) - len(module.lstrip("."))
            pkg = importer.split("/")[:-1]
            if level > 1:
                pkg = pkg[:len(pkg) - (level - 1)] if level - 1 <= len(pkg) else None
            if pkg is None:
                return None
            rest = module[level:]
            base = "/".join(pkg + (rest.split(".") if rest else []))
            for cand in (base + ".py", base + "/__init__.py", base + ".pyi"):
                if cand.lstrip("/") in self.files:
                    return cand.lstrip("/")
            return None
        hits = self.modules().get(module)
        return hits[0] if hits else None

    def _js_module(self, importer: str, spec: str) -> str | None:
        base = posixpath.normpath(posixpath.join(posixpath.dirname(importer), spec))
        if base.startswith(".."):
            return None
        stem = base.rsplit(".", 1)[0] if base.endswith((".js", ".jsx", ".mjs")) else base  # TS imports "./x.js"
        for cand in (base, *(stem + e for e in JS_EXTS), *(base + "/index" + e for e in JS_EXTS)):
            if cand in self.files:
                return cand
        return None

    def _go_package(self, path: str) -> str | None:
        """The first (sorted) Go file of the directory the import path names."""
        best = None
        for rel in sorted(self.files):
            d = posixpath.dirname(rel)
            if rel.endswith(".go") and d and (path == d or path.endswith("/" + d)):
                if best is None or len(d) > len(posixpath.dirname(best)):
                    best = rel
        return best

    def package_files(self, rel: str) -> list[str]:
        """Files that share one namespace with ``rel`` (a Go package's directory; otherwise itself)."""
        if not rel.endswith(".go"):
            return [rel]
        d = posixpath.dirname(rel)
        return sorted(p for p in self.files if p.endswith(".go") and posixpath.dirname(p) == d)

    # -- names -----------------------------------------------------------------------------------------
    def lookup(self, rel: str, name: str, hops: int = 3) -> Target | None:
        """``name`` as defined in (or re-exported by) module file ``rel``."""
        for f in self.package_files(rel):
            sym = self.files.get(f)
            for d in sym.definitions if sym else ():
                if d.name == name and d.parent is None:
                    return Target(f, d)
        sym = self.files.get(rel)
        if hops and sym is not None:
            for imp in sym.imports:
                for orig, local in imp.names:
                    if local == name or orig == "*":  # a re-export, or `from .mod import *`
                        src = self.resolve_module(rel, imp)
                        if src in (None, rel):
                            continue
                        t = self.lookup(src, name if orig == "*" else orig, hops - 1)
                        if t is not None:
                            return t
        if rel.endswith("__init__.py"):  # `from pkg import submodule`
            sub = rel[:-len("__init__.py")] + name
            for cand in (sub + ".py", sub + "/__init__.py"):
                if cand in self.files:
                    return Target(cand)
        return None

    def bindings(self, rel: str, imports: tuple[Import, ...]) -> dict[str, Target]:
        """Local name -> project target, for each import of file ``rel`` that resolves in the project."""
        out: dict[str, Target] = {}
        for imp in imports:
            src = self.resolve_module(rel, imp)
            if imp.names:
                for orig, local in imp.names:
                    if orig == "*":
                        continue
                    if src is None:  # `from . import mod`, `from pkg import sub`: a submodule
                        sub = self.resolve_module(rel, imp.module.rstrip(".") + "." + orig
                                                  if imp.module.strip(".") else imp.module + orig)
                        if sub is not None:
                            out[local] = Target(sub)
                        continue
                    t = self.lookup(src, orig) if orig != "default" else None
                    if t is not None and t.path != rel:
                        out[local] = t
            if src is not None and src != rel and (imp.alias or not imp.names):
                local = imp.alias or self._default_local(imp)
                if local:
                    out[local] = Target(src)
        return out

    @staticmethod
    def _default_local(imp: Import) -> str | None:
        """The name a whole-module import binds: Python binds ``import a.b`` as ``a`` (only the full path
        resolves it, so it is bound to the module only when it has one part); Go binds the last part."""
        if "/" in imp.module:
            return imp.module.rstrip("/").rsplit("/", 1)[-1]
        return imp.module if "." not in imp.module else None
