"""Document helpers: cursor positions and reading source files."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import DocumentError

if TYPE_CHECKING:  # numpy is imported where it is used: `efim --version` and the CLI's daemon path skip it
    import numpy as np

MAX_DOCUMENT_BYTES = 8 * 1024 * 1024  # UTF-8 bytes
FIND_LINES = 1000  # up to this line, str.find line by line is quicker than indexing the whole text


def offset_of(text: str, line: int, character: int) -> int:
    """Offset of a 0-based (line, character) position, in code points; raises if outside.

    Never a Python loop over many lines: past the first few, the line starts are found by numpy."""
    if line < 0 or character < 0:
        raise DocumentError(f"cursor line {line}, character {character} is negative")
    if line > FIND_LINES:
        return LineIndex(text).offset(line, character)
    start = 0
    for _ in range(line):
        nl = text.find("\n", start)
        if nl < 0:
            raise DocumentError(f"cursor line {line + 1} is past the end of the document")
        start = nl + 1
    end = text.find("\n", start)
    return _column(text, line, character, start, len(text) if end < 0 else end)


def _column(text: str, line: int, character: int, start: int, end: int) -> int:
    """The offset of ``character`` in the line [start, end) (``end`` at its newline or the text's end)."""
    if end > start and text[end - 1] == "\r" and end < len(text):
        end -= 1  # the CR of a CRLF is not a column
    if start + character > end:
        raise DocumentError(f"cursor column {character + 1} is past the end of line {line + 1} "
                            f"({end - start} characters)")
    return start + character


def _newlines(text: str) -> np.ndarray:
    """Offsets of the newlines in ``text`` (at C speed: one pass over its UTF-32 code units)."""
    import numpy as np

    units = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    return np.flatnonzero(units == 10)


class LineIndex:
    """A text with the offsets of its line starts, kept up to date through ``replace``: a batch of
    edits positioned by (line, character) costs one pass over the text, not one per edit."""

    def __init__(self, text: str):
        import numpy as np

        self.text = text
        self.starts = np.concatenate(([0], _newlines(text) + 1))

    def offset(self, line: int, character: int) -> int:
        if line < 0 or character < 0:
            raise DocumentError(f"cursor line {line}, character {character} is negative")
        if line >= len(self.starts):
            raise DocumentError(f"cursor line {line + 1} is past the end of the document")
        start = int(self.starts[line])
        end = int(self.starts[line + 1]) - 1 if line + 1 < len(self.starts) else len(self.text)
        return _column(self.text, line, character, start, end)

    def replace(self, start: int, end: int, new: str) -> None:
        """Replace ``text[start:end]`` with ``new``."""
        import numpy as np

        first = int(np.searchsorted(self.starts, start, side="right"))  # lines starting after start...
        last = int(np.searchsorted(self.starts, end, side="right"))  # ...up to end are gone
        added = _newlines(new) + (start + 1) if "\n" in new else np.empty(0, dtype=self.starts.dtype)
        shift = len(new) - (end - start)
        self.starts = np.concatenate((self.starts[:first], added, self.starts[last:] + shift))
        self.text = self.text[:start] + new + self.text[end:]


def open_regular(path: str | Path, follow: bool = True) -> tuple[int, os.stat_result]:
    """A read-only descriptor on ``path`` and its stat, if it is a regular file (else a one-line
    DocumentError). Opened with O_NONBLOCK: a FIFO never waits for a writer. ``follow=False``: a
    symbolic link is an error too. The caller closes the descriptor."""
    p = Path(path)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(p, flags)
    except FileNotFoundError:
        raise DocumentError(f"file not found: {p}") from None
    except PermissionError:
        raise DocumentError(f"permission denied: {p}") from None
    except OSError as e:
        what = "is a symbolic link" if e.errno == errno.ELOOP and not follow else f"cannot read ({e.strerror})"
        raise DocumentError(f"{what}: {p}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise DocumentError(f"{'is a directory' if stat.S_ISDIR(st.st_mode) else 'not a regular file'}: {p}")
    return fd, st


def read_source(path: str | Path, follow: bool = True) -> str:
    """Read a UTF-8 source file, with one-line errors for the usual problems.

    Only a regular file is read (see open_regular), and at most the document limit: a FIFO, a
    device such as /dev/zero or a file that keeps growing is an error, never a hang or an
    unbounded read."""
    fd, st = open_regular(path, follow)
    try:
        if st.st_size > MAX_DOCUMENT_BYTES:
            raise DocumentError(f"{path} is larger than {MAX_DOCUMENT_BYTES >> 20} MiB")
        chunks, n = [], 0
        while n <= MAX_DOCUMENT_BYTES:  # the file may grow while it is read
            chunk = os.read(fd, MAX_DOCUMENT_BYTES + 1 - n)
            if not chunk:
                break
            chunks.append(chunk)
            n += len(chunk)
    except OSError as e:
        raise DocumentError(f"cannot read {path}: {e.strerror}") from None
    finally:
        os.close(fd)
    return decode(b"".join(chunks), str(path))


def decode(data: bytes, name: str = "input") -> str:
    if len(data) > MAX_DOCUMENT_BYTES:
        raise DocumentError(f"{name} is larger than {MAX_DOCUMENT_BYTES >> 20} MiB")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DocumentError(f"{name} is not valid UTF-8 (byte {e.start})") from None
