"""The engine: requests in, completions out, over one llama.cpp context with several slots."""

from .engine import Engine, make_planner
from .request import Completion, CompletionRequest, Timings, TokenCounts

__all__ = ["Engine", "make_planner", "Completion", "CompletionRequest", "Timings", "TokenCounts"]
