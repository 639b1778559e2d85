"""Results: the JSON file a run saves and its tables; the evaluation's, and the benchmarks' too
(bench/util.py re-exports them)."""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path

RESULTS = Path("bench-results")


def table(rows: list[dict], cols: list[str]) -> str:
    fmt = lambda v: (f"{v:.0f}" if abs(v) >= 100 else f"{v:.2f}") if isinstance(v, float) else str(v)
    cells = [[fmt(r.get(c, "")) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    line = lambda vals: "| " + " | ".join(v.ljust(w) for v, w in zip(vals, widths)) + " |"
    return "\n".join([line(cols), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, cells)])


def save(name: str, payload: dict, results: Path = RESULTS) -> Path:
    results.mkdir(parents=True, exist_ok=True)
    payload = {"benchmark": name, "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
               "machine": platform.machine(), "python": platform.python_version(), **payload}
    path = results / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2))
    return path
