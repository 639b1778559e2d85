"""Source text for training, calibration and benchmarks: the Python standard library."""

from __future__ import annotations

import sysconfig
from pathlib import Path


def stdlib_files(limit_bytes: int = 1_500_000, include_tests: bool = False) -> list[Path]:
    """Standard-library sources in a fixed order, up to ``limit_bytes``."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files, total = [], 0
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root).parts
        if rel[0] in ("site-packages", "idlelib", "lib2to3", "turtledemo") or "test" in rel[:-1]:
            if not (include_tests and "test" in rel[:-1]):
                continue
        size = p.stat().st_size
        if total + size > limit_bytes:
            break
        files.append(p)
        total += size
    return files


def read_texts(files) -> list[str]:
    return [p.read_text("utf-8", errors="replace") for p in files]


def calibration_text(n_chars: int = 400_000) -> str:
    """Standard-library test sources: code on every machine, and not what benchmarks evaluate on."""
    root_files = [p for p in stdlib_files(50_000_000, include_tests=True) if "test" in p.parts]
    out, total = [], 0
    for p in root_files:
        out.append(p.read_text("utf-8", errors="replace"))
        total += len(out[-1])
        if total >= n_chars:
            break
    return "".join(out)
