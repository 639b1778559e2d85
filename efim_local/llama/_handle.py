"""Base class for objects that own one llama.cpp handle and free it deterministically."""

from __future__ import annotations


class Handle:
    """Frees its handle on close(), on leaving a ``with`` block, or at garbage collection."""

    _open = False

    def _free(self) -> None:  # pragma: no cover - each subclass frees its own handle
        raise NotImplementedError

    def close(self) -> None:
        if self._open:
            self._open = False
            self._free()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()
