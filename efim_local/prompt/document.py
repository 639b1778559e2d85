"""Document helpers: cursor positions and reading source files."""

from __future__ import annotations

from pathlib import Path


from ..errors import DocumentError


MAX_DOCUMENT_BYTES = 8 * 1024 * 1024


def offset_of(text: str, line: int, character: int) -> int:
    """Offset of a 0-based (line, character) position, in code points; raises if outside."""
    if line < 0 or character < 0:
        raise DocumentError(f"cursor line {line}, character {character} is negative")
    start = 0
    for _ in range(line):
        nl = text.find("\n", start)
        if nl < 0:
            raise DocumentError(f"cursor line {line + 1} is past the end of the document")
        start = nl + 1
    end = text.find("\n", start)
    end = len(text) if end < 0 else end
    if end > start and text[end - 1] == "\r" and end < len(text):
        end -= 1  # the CR of a CRLF is not a column
    if start + character > end:
        raise DocumentError(f"cursor column {character + 1} is past the end of line {line + 1} "
                            f"({end - start} characters)")
    return start + character


def read_source(path: str | Path) -> str:
    """Read a UTF-8 source file, with one-line errors for the usual problems."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise DocumentError(f"file not found: {p}") from None
    except IsADirectoryError:
        raise DocumentError(f"is a directory: {p}") from None
    except PermissionError:
        raise DocumentError(f"permission denied: {p}") from None
    return decode(data, str(p))


def decode(data: bytes, name: str = "input") -> str:
    if len(data) > MAX_DOCUMENT_BYTES:
        raise DocumentError(f"{name} is larger than {MAX_DOCUMENT_BYTES >> 20} MiB")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DocumentError(f"{name} is not valid UTF-8 (byte {e.start})") from None
