"""Repository context in the model family's trained format.

A repository-aware prompt puts other files before the current one, each under its real relative path:

- Qwen2.5-Coder: ``<|repo_name|>name\\n<|file_sep|>a.py\\n...<|file_sep|>cur.py\\n<|fim_prefix|>...``;
- StarCoder2: the same with ``<repo_name>`` and ``<file_sep>``;
- any other model: plain text, each file under a comment with its path (``# file: a.py``).

The output is a list of segments ``(text, is_marker)``: markers become their single special token,
text is tokenized as document text (a file that contains ``<|file_sep|>`` cannot forge a marker).
Segments are tokenized one by one, so the tokens of a piece never depend on what follows it: the T0
head is the same token prefix for every file of a project.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .templates import Template, Vocab

Segment = tuple[str, bool]  # (text, is_marker)


@dataclass(frozen=True)
class Piece:
    """One file's worth of context: its relative path (posix) and the text shown for it."""

    path: str
    text: str


@dataclass(frozen=True)
class RepoFormat:
    name: str  # "qwen", "starcoder2" or "text"
    repo: str | None = None  # marker before the repository name; None: plain text
    sep: str | None = None  # marker before each file's path


FORMATS = {
    "qwen": RepoFormat("qwen", "<|repo_name|>", "<|file_sep|>"),
    "starcoder2": RepoFormat("starcoder2", "<repo_name>", "<file_sep>"),
    "text": RepoFormat("text"),
}
# FIM families whose models were trained on a repository format (templates.FAMILIES names).
FAMILY_FORMAT = {"qwen": "qwen", "qwen2.5-coder": "qwen", "starcoder": "starcoder2", "starcoder2": "starcoder2"}

HASH_COMMENT = (".py", ".pyi", ".sh", ".rb", ".toml", ".yaml", ".yml", ".pl", ".r", ".jl")


def repo_format(template: Template | None = None, vocab: Vocab | None = None) -> RepoFormat:
    """The format a model was trained on: from its FIM family, else from the marker tokens its vocabulary
    has (a GGUF without a family name), else plain text."""
    if template is not None and template.source.startswith("family:"):
        fmt = FAMILY_FORMAT.get(template.source.split(":", 1)[1])
        if fmt:
            return FORMATS[fmt]
    if vocab is not None and (template is None or template.source != "text"):
        for fmt in (FORMATS["qwen"], FORMATS["starcoder2"]):
            if vocab.token_id(fmt.repo) is not None and vocab.token_id(fmt.sep) is not None:
                return fmt
    return FORMATS["text"]


def comment(path: str) -> str:
    """The line-comment leader of a file's language (plain-text format)."""
    return "#" if path.lower().endswith(HASH_COMMENT) else "//"


def _body(text: str) -> str:
    return text if not text or text.endswith("\n") else text + "\n"


def repo_head(fmt: RepoFormat, repo_name: str) -> list[Segment]:
    """What opens the repository context (once, before every piece)."""
    if fmt.repo is None:
        return [(f"# repository: {repo_name}\n", False)]
    return [(fmt.repo, True), (repo_name + "\n", False)]


def file_pieces(fmt: RepoFormat, pieces: Sequence[Piece]) -> list[Segment]:
    """Other files' context, in the order given."""
    out: list[Segment] = []
    for p in pieces:
        if fmt.sep is None:
            out.append((f"{comment(p.path)} file: {p.path}\n{_body(p.text)}\n", False))
        else:
            out += [(fmt.sep, True), (f"{p.path}\n{_body(p.text)}", False)]
    return out


def current_file(fmt: RepoFormat, path: str) -> list[Segment]:
    """The header of the file being completed; its prefix (and the FIM markers) follow."""
    if fmt.sep is None:
        return [(f"{comment(path)} file: {path}\n", False)]
    return [(fmt.sep, True), (path + "\n", False)]


def render(fmt: RepoFormat, repo_name: str, tiers: Sequence[Sequence[Piece]], path: str) -> list[Segment]:
    """The whole context before the current file: head, each tier's pieces (most stable first), the
    current file's header."""
    out = repo_head(fmt, repo_name)
    for pieces in tiers:
        out += file_pieces(fmt, pieces)
    return out + current_file(fmt, path)


def tokenize_segments(segments: Sequence[Segment], vocab: Vocab) -> list[int]:
    """Tokens of ``segments``: one special token per marker, document tokens for text."""
    out: list[int] = []
    for text, marker in segments:
        if marker:
            tid = vocab.token_id(text)
            if tid is None:
                raise ValueError(f"the model has no {text!r} token")
            out.append(tid)
        elif text:
            out += vocab.tokenize(text)
    return out


def text_of(segments: Sequence[Segment]) -> str:
    """The segments as one string (for logs and tests)."""
    return "".join(t for t, _ in segments)
