"""The engine: requests in, completions out, over one llama.cpp context with several slots."""

from ..request import CompletionRequest
from .completion import Completion, Timings, TokenCounts

__all__ = ["Engine", "make_planner", "Completion", "CompletionRequest", "Timings", "TokenCounts"]


def __getattr__(name: str):
    # Lazy: the request schema is needed by commands that never load llama.cpp (fast CLI start-up).
    if name in ("Engine", "make_planner"):
        from . import engine

        return getattr(engine, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
