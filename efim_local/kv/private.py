"""The store's directory: created owner-only."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ..errors import StoreError


def private_dir(d: Path) -> Path:
    """Create ``d`` owner-only; chmod it only when its mode is wrong (a read-only disk is the caller's
    to handle: the OSError propagates)."""
    try:
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
    except FileExistsError:
        raise StoreError(f"{d} is not a directory") from None
    st = d.stat()
    if not stat.S_ISDIR(st.st_mode):
        raise StoreError(f"{d} is not a directory")
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(d, 0o700)
    return d
