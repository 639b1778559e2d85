"""The LSP server's copy of each open document, and position conversion.

LSP positions count ``character`` in the negotiated encoding's code units (UTF-16 unless the client
offers UTF-8 or UTF-32); the daemon counts code points. Lines split on ``\\n`` only, like the daemon's
(a CRLF line's ``\\r`` is not a column; a lone ``\\r`` is an ordinary character). A document is kept
as a list of lines, so that an edit copies only the lines it touches.
"""

from __future__ import annotations

from ..errors import InvalidParams

MAX_LINE = 1 << 31
# code units per code point for each LSP position encoding (None: one unit is one code point)
CODECS = {"utf-8": ("utf-8", 1), "utf-16": ("utf-16-le", 2), "utf-32": None}


def split_lines(text: str) -> list[str]:
    """``text`` as lines that keep their ``\\n``; the last one has none (it may be empty)."""
    parts = text.split("\n")
    return [p + "\n" for p in parts[:-1]] + [parts[-1]]


def columns(line: str) -> str:
    """The columns of a line: without its ``\\n`` and the ``\\r`` of a CRLF."""
    if line.endswith("\n"):
        line = line[:-1]
        if line.endswith("\r"):
            line = line[:-1]
    return line


class Converter:
    """Code units of one position encoding <-> code points, within one line."""

    def __init__(self, encoding: str = "utf-16"):
        if encoding not in CODECS:
            raise ValueError(f"unknown position encoding {encoding!r}")
        self.encoding, self.codec = encoding, CODECS[encoding]

    def to_points(self, cols: str, units: int) -> int:
        """Code units from the line's start -> code points; past the end means the end (LSP)."""
        if self.codec is None or cols.isascii():
            return min(units, len(cols))
        codec, width = self.codec
        data = cols.encode(codec, "surrogatepass")
        if units * width >= len(data):
            return len(cols)
        try:
            head = data[:units * width].decode(codec, "surrogatepass")
        except UnicodeDecodeError:  # UTF-8: a cut multi-byte sequence
            head = None
        if head is None or (head and head[-1] != cols[len(head) - 1]):  # UTF-16: half a surrogate pair
            raise InvalidParams(f"invalid params: character {units} splits a character")
        return len(head)

    def to_units(self, cols: str, points: int) -> int:
        """Code points from the line's start -> code units."""
        if self.codec is None or cols.isascii():
            return points
        codec, width = self.codec
        return len(cols[:points].encode(codec, "surrogatepass")) // width


class Doc:
    """One open document: its lines, version and language, and whether it is in step."""

    def __init__(self, text: str, version: int = 0, language: str = ""):
        self.lines = split_lines(text)
        self.version, self.language = version, language
        self.daemon_error: str | None = None  # why the daemon's copy is not this one (sync.py)
        self.editor_error: str | None = None  # why this copy may not be the editor's
        self.full_seq = 0  # the last sync message that carried the whole text
        self.full_answered = 0  # the last such message the daemon answered
        # The cursor's line as the daemon last heard of it: a completion's or a cursor note's (an edit
        # tells it nothing: cursor.py). None when it heard none (a new daemon, a whole new text).
        self.line: int | None = None

    @property
    def text(self) -> str:
        return "".join(self.lines)

    def point(self, line: int, units: int, conv: Converter) -> tuple[int, int]:
        """An LSP position -> (line, code-point column); a line past the end is an error."""
        if not 0 <= line < len(self.lines) or not 0 <= units < MAX_LINE:
            raise InvalidParams(f"invalid params: position line {line}, character {units} is outside the document "
                                f"({len(self.lines)} lines)")
        return line, conv.to_points(columns(self.lines[line]), units)

    def apply(self, start: tuple[int, int], end: tuple[int, int], new: str) -> None:
        """Replace the code-point range ``start``..``end`` (as given by ``point``) with ``new``."""
        (sl, sc), (el, ec) = start, end
        if (el, ec) < (sl, sc):
            raise InvalidParams("invalid params: range end before start")
        pieces = split_lines(self.lines[sl][:sc] + new + self.lines[el][ec:])
        if el < len(self.lines) - 1:
            pieces.pop()  # the edited last line kept its "\n": the next line follows as it is
        self.lines[sl:el + 1] = pieces

    def replace(self, text: str) -> None:
        self.lines = split_lines(text)
        self.line = None

    def word_start(self, line: int, col: int) -> int:
        """Column where the identifier that ends at (line, col) starts (``col`` if none)."""
        s = self.lines[line]
        i = col
        while i > 0 and (s[i - 1].isalnum() or s[i - 1] == "_"):
            i -= 1
        return i
