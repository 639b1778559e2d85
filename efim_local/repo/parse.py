"""Definitions, imports and used names of a source file, from a tree-sitter parse.

Languages: Python, JavaScript, TypeScript (and TSX), Go; each grammar is a PyPI wheel loaded on first
use. A file in another language, or one that fails to parse, yields no symbols (never an error).
"""

from __future__ import annotations

import bisect
import hashlib
import importlib
from dataclasses import dataclass
from functools import lru_cache

EXTENSIONS = {".py": "python", ".pyi": "python", ".js": "javascript", ".mjs": "javascript", ".cjs": "javascript",
              ".jsx": "javascript", ".ts": "typescript", ".mts": "typescript", ".cts": "typescript",
              ".tsx": "tsx", ".go": "go"}
_GRAMMARS = {"python": ("tree_sitter_python", "language"), "javascript": ("tree_sitter_javascript", "language"),
             "typescript": ("tree_sitter_typescript", "language_typescript"),
             "tsx": ("tree_sitter_typescript", "language_tsx"), "go": ("tree_sitter_go", "language")}
# Node types that name something where it is used (identifiers, types, properties).
_ID_TYPES = {"python": ("identifier",),
             "javascript": ("identifier", "property_identifier", "shorthand_property_identifier"),
             "go": ("identifier", "type_identifier", "field_identifier", "package_identifier")}
_ID_TYPES["typescript"] = _ID_TYPES["tsx"] = _ID_TYPES["javascript"] + ("type_identifier",)
# Member access: (object, attribute) pairs, e.g. ``mod.func``.
_PAIR_QUERY = {"python": "(attribute object: (identifier) @o attribute: (identifier) @a)",
               "javascript": "(member_expression object: (identifier) @o property: (property_identifier) @a)",
               "go": "[(selector_expression operand: (identifier) @o field: (field_identifier) @a)"
                     " (qualified_type package: (package_identifier) @o name: (type_identifier) @a)]"}
_PAIR_QUERY["typescript"] = _PAIR_QUERY["tsx"] = _PAIR_QUERY["javascript"]
_IMPORT_TYPES = {"python": ("import_statement", "import_from_statement", "future_import_statement"),
                 "go": ("import_declaration",), "javascript": ("import_statement",)}
_IMPORT_TYPES["typescript"] = _IMPORT_TYPES["tsx"] = _IMPORT_TYPES["javascript"]


@dataclass(frozen=True)
class Definition:
    name: str
    kind: str  # class, function, method, variable, type
    line: int  # first line, 0-based (decorators included)
    end_line: int  # last line, 0-based
    signature: str  # the header up to the body (whitespace-normalised lines)
    sig_lines: int  # lines the header spans in the source
    parent: str | None = None  # the class (or Go receiver type) of a method


@dataclass(frozen=True)
class Import:
    module: str  # as written: "pkg.mod", "..mod", "./util", "example.com/x/pkg"
    names: tuple[tuple[str, str], ...] = ()  # (imported name, local name); "*" for a wildcard
    alias: str | None = None  # the local name of a whole-module import, when it has one
    line: int = 0


@dataclass(frozen=True)
class FileSymbols:
    path: str
    lang: str | None
    digest: str  # sha256 of the source bytes
    definitions: tuple[Definition, ...] = ()
    imports: tuple[Import, ...] = ()


def language_of(path: str) -> str | None:
    dot = path.rfind(".")
    return EXTENSIONS.get(path[dot:].lower()) if dot >= 0 else None


@lru_cache(maxsize=None)
def parser(lang: str):
    """A tree-sitter parser for ``lang`` (grammar wheels are imported on first use)."""
    import tree_sitter as ts

    module, fn = _GRAMMARS[lang]
    return ts.Parser(ts.Language(getattr(importlib.import_module(module), fn)()))


@lru_cache(maxsize=None)
def _query(lang: str, source: str):
    import tree_sitter as ts

    return ts.Query(parser(lang).language, source)


def _text(node, src: bytes) -> str:
    return src[node.start_byte:node.end_byte].decode("utf-8", "replace")


def _header(node, src: bytes, body_field: str = "body") -> tuple[str, int]:
    """The definition's text before its body, lines stripped (at most 6), and how many lines it spans."""
    body = node.child_by_field_name(body_field)
    end = body.start_byte if body is not None else src.find(b"\n", node.start_byte)
    colon = [c.end_byte for c in node.children if c.type == ":" and c.end_byte <= end]
    end = colon[-1] if colon and body is not None else end  # Python: stop before a trailing comment
    end = node.end_byte if end < 0 or end > node.end_byte else end
    lines = [ln.strip() for ln in src[node.start_byte:end].decode("utf-8", "replace").splitlines() if ln.strip()]
    sig = "\n".join(lines[:6]).rstrip("{ ").rstrip()
    return sig, max(1, src[node.start_byte:end].count(b"\n") + (0 if end > node.start_byte else 1))


def _def(node, src, name: str, kind: str, start=None, parent=None, body_field="body") -> Definition:
    sig, n = _header(node, src, body_field)
    first = (start or node).start_point[0]
    return Definition(name, kind, first, node.end_point[0], sig, n + node.start_point[0] - first, parent)


# -- Python ----------------------------------------------------------------------------------------------
def _py_defs(block, src: bytes, out: list, parent: str | None = None, depth: int = 0) -> None:
    for child in block.named_children:
        node = child.child_by_field_name("definition") if child.type == "decorated_definition" else child
        if node is None:
            continue
        name = node.child_by_field_name("name")
        if node.type == "function_definition" and name is not None:
            out.append(_def(node, src, _text(name, src), "method" if parent else "function", child, parent))
        elif node.type == "class_definition" and name is not None and parent is None:
            cls = _text(name, src)
            out.append(_def(node, src, cls, "class", child))
            body = node.child_by_field_name("body")
            if body is not None:
                _py_defs(body, src, out, cls)
        elif node.type == "expression_statement" and parent is None and node.named_children:
            a = node.named_children[0]
            left = a.child_by_field_name("left") if a.type == "assignment" else None
            if left is not None and left.type == "identifier":
                line = _text(node, src).splitlines()[0][:160]
                out.append(Definition(_text(left, src), "variable", node.start_point[0], node.end_point[0], line, 1))
        elif node.type in ("if_statement", "try_statement") and parent is None and depth < 2:
            for part in (node, *node.named_children):  # `if TYPE_CHECKING:`, `try: ... except ImportError:`
                for blk in part.named_children:
                    if blk.type == "block":
                        _py_defs(blk, src, out, None, depth + 1)


def _py_imports(root, src: bytes, lang: str = "python") -> list[Import]:
    out = []
    for node in _captures(root, "python", "[(import_statement) (import_from_statement)] @i"):
        line = node.start_point[0]
        if node.type == "import_statement":
            for n in node.children_by_field_name("name"):
                if n.type == "aliased_import":
                    out.append(Import(_text(n.child_by_field_name("name"), src),
                                      alias=_text(n.child_by_field_name("alias"), src), line=line))
                else:
                    out.append(Import(_text(n, src), line=line))
            continue
        mod = node.child_by_field_name("module_name")
        names = []
        for n in node.children_by_field_name("name"):
            if n.type == "aliased_import":
                names.append((_text(n.child_by_field_name("name"), src), _text(n.child_by_field_name("alias"), src)))
            else:
                names.append((_text(n, src), _text(n, src)))
        if any(c.type == "wildcard_import" for c in node.named_children):
            names.append(("*", "*"))
        out.append(Import(_text(mod, src).replace(" ", "") if mod is not None else "", tuple(names), line=line))
    return out


# -- JavaScript / TypeScript --------------------------------------------------------------------------------
_JS_DEFS = {"function_declaration": "function", "generator_function_declaration": "function",
            "class_declaration": "class", "abstract_class_declaration": "class", "interface_declaration": "type",
            "type_alias_declaration": "type", "enum_declaration": "type"}


def _js_defs(root, src: bytes, out: list) -> None:
    for child in root.named_children:
        node = child.child_by_field_name("declaration") if child.type == "export_statement" else child
        if node is None:
            continue
        name = node.child_by_field_name("name")
        if node.type in _JS_DEFS and name is not None:
            kind = _JS_DEFS[node.type]
            out.append(_def(node, src, _text(name, src), kind, child))
            body = node.child_by_field_name("body")
            if kind == "class" and body is not None:
                for m in body.named_children:
                    mname = m.child_by_field_name("name")
                    if m.type == "method_definition" and mname is not None:
                        out.append(_def(m, src, _text(mname, src), "method", parent=_text(name, src)))
        elif node.type in ("lexical_declaration", "variable_declaration"):
            for d in node.named_children:
                dname = d.child_by_field_name("name") if d.type == "variable_declarator" else None
                if dname is not None and dname.type == "identifier":
                    val = d.child_by_field_name("value")
                    fn = val is not None and val.type in ("arrow_function", "function_expression", "function")
                    head = _text(node, src).splitlines()[0][:160]
                    out.append(Definition(_text(dname, src), "function" if fn else "variable", child.start_point[0],
                                          node.end_point[0], head, 1))


def _js_imports(root, src: bytes, lang: str = "javascript") -> list[Import]:
    out = []
    for node in _captures(root, lang, "(import_statement) @i"):
        source = node.child_by_field_name("source")
        if source is None:
            continue
        module = _text(source, src).strip("'\"`")
        names, alias = [], None
        for clause in (c for c in node.named_children if c.type == "import_clause"):
            for c in clause.named_children:
                if c.type == "identifier":
                    names.append(("default", _text(c, src)))
                elif c.type == "namespace_import":
                    alias = _text(c.named_children[-1], src)
                elif c.type == "named_imports":
                    for s in c.named_children:
                        n, a = s.child_by_field_name("name"), s.child_by_field_name("alias")
                        if n is not None:
                            names.append((_text(n, src), _text(a or n, src)))
        out.append(Import(module, tuple(names), alias, node.start_point[0]))
    return out


# -- Go ------------------------------------------------------------------------------------------------------
def _go_defs(root, src: bytes, out: list) -> None:
    for node in root.named_children:
        name = node.child_by_field_name("name")
        if node.type == "function_declaration" and name is not None:
            out.append(_def(node, src, _text(name, src), "function"))
        elif node.type == "method_declaration" and name is not None:
            recv = node.child_by_field_name("receiver")
            types = [_text(t, src) for t in _captures(recv, "go", "(type_identifier) @t")] if recv else []
            out.append(_def(node, src, _text(name, src), "method", parent=types[0] if types else None))
        elif node.type in ("type_declaration", "const_declaration", "var_declaration"):
            for spec in _captures(node, "go", "[(type_spec) (const_spec) (var_spec) (type_alias)] @s"):
                for n in spec.children_by_field_name("name"):
                    kind = "type" if spec.type in ("type_spec", "type_alias") else "variable"
                    out.append(_def(spec, src, _text(n, src), kind, body_field="__none__"))


def _go_imports(root, src: bytes, lang: str = "go") -> list[Import]:
    out = []
    for spec in _captures(root, "go", "(import_spec) @s"):
        path, name = spec.child_by_field_name("path"), spec.child_by_field_name("name")
        if path is not None:
            out.append(Import(_text(path, src).strip('"`'), alias=_text(name, src) if name is not None else None,
                              line=spec.start_point[0]))
    return out


def _captures(node, lang: str, query: str) -> list:
    """Nodes captured by ``query`` under ``node``, in source order."""
    import tree_sitter as ts

    got = ts.QueryCursor(_query(lang, query)).captures(node)
    return sorted((n for nodes in got.values() for n in nodes), key=lambda n: n.start_byte)


_EXTRACT = {"python": (_py_defs, _py_imports), "javascript": (_js_defs, _js_imports),
            "typescript": (_js_defs, _js_imports), "tsx": (_js_defs, _js_imports), "go": (_go_defs, _go_imports)}


def parse_tree(path: str, source: bytes):
    lang = language_of(path)
    return lang, (parser(lang).parse(source) if lang else None)


def parse_file(path: str, source: bytes) -> FileSymbols:
    """The top-level definitions (and class methods) and the imports of one file."""
    digest = hashlib.sha256(source).hexdigest()
    lang, tree = parse_tree(path, source)
    if tree is None:
        return FileSymbols(path, lang, digest)
    defs_of, imports_of = _EXTRACT[lang]
    defs: list[Definition] = []
    defs_of(tree.root_node, source, defs)
    return FileSymbols(path, lang, digest, tuple(defs), tuple(imports_of(tree.root_node, source, lang)))


@dataclass(frozen=True)
class Uses:
    """Names a file refers to outside its import statements: counts, and (object, attribute) pairs."""

    names: dict[str, int]
    pairs: dict[tuple[str, str], int]


def uses(path: str, source: bytes) -> Uses:
    """What ``source`` refers to (identifiers and member accesses), import statements excluded."""
    lang, tree = parse_tree(path, source)
    if tree is None:
        return Uses({}, {})
    root = tree.root_node
    skip = [(n.start_byte, n.end_byte) for n in _captures(root, lang, " ".join(f"({t})" for t in _IMPORT_TYPES[lang])
                                                          .join("[]") + " @i")]
    starts = [a for a, _ in skip]

    def outside(n) -> bool:
        k = bisect.bisect_right(starts, n.start_byte) - 1
        return k < 0 or n.start_byte >= skip[k][1]

    names: dict[str, int] = {}
    for n in _captures(root, lang, "[" + " ".join(f"({t})" for t in _ID_TYPES[lang]) + "] @n"):
        if outside(n):
            t = _text(n, source)
            names[t] = names.get(t, 0) + 1
    pairs: dict[tuple[str, str], int] = {}
    import tree_sitter as ts

    for _, caps in ts.QueryCursor(_query(lang, _PAIR_QUERY[lang])).matches(root):
        o, a = caps["o"][0], caps["a"][0]
        if outside(o):
            key = (_text(o, source), _text(a, source))
            pairs[key] = pairs.get(key, 0) + 1
    return Uses(names, pairs)
