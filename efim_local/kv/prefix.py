"""Token-prefix arithmetic shared by the live slots and the saved states."""

from __future__ import annotations

import numpy as np


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the common prefix of two int arrays (vectorised, no Python loop)."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n
