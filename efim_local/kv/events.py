"""Typed hit and miss events: where a request's KV came from, or why it did not come from the store.

The reuse seam (``engine/reuse.py``) records one event per request; the store counts them and
``efim status`` / ``efim cache stats`` report the counts.
"""

from __future__ import annotations

from dataclasses import dataclass

TIERS = ("slot", "ram", "disk")
# Why no saved state served a request (keep stable: they are reported to users).
MISS_REASONS = (
    "no_state",  # nothing saved shares a long enough token prefix
    "model_changed",  # the file's states belong to another model
    "evicted",  # the file's state was evicted under the disk budget
    "corrupt",  # a matching state file was bad and has been dropped
    "tokenization_differs",  # the same text was saved, but planned into other tokens
)


@dataclass(frozen=True)
class Hit:
    """The request started from reused KV of ``tier``; ``sparse`` if only a subset was restored."""

    tier: str
    sparse: bool = False

    def __post_init__(self):
        if self.tier not in TIERS:
            raise ValueError(f"unknown tier {self.tier!r}")


@dataclass(frozen=True)
class Miss:
    """No saved state served the request, for ``reason`` (one of MISS_REASONS)."""

    reason: str

    def __post_init__(self):
        if self.reason not in MISS_REASONS:
            raise ValueError(f"unknown miss reason {self.reason!r}")


Event = Hit | Miss


def counter_names(event: Event) -> list[str]:
    """The store's counters an event increments."""
    if isinstance(event, Hit):
        return [f"hit_{event.tier}"] + (["sparse_restores"] if event.sparse else [])
    return [f"miss_{event.reason}"]
