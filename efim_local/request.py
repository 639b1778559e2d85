"""The completion request, defined once: *where* (a position in a document) and *how* (options).

A leaf module: it imports nothing of the package but its errors, so that every layer can use it.
Every way in builds a :class:`CompletionRequest` from this one definition: the library API
constructs it directly, the daemon validates JSON-RPC params with :meth:`CompletionRequest.from_params`
(one-line ``InvalidParams`` errors, see docs/protocol.md), the CLI turns the option fields into
flags (``efim_local.cli.request_options``) and back into params for the daemon
(:meth:`CompletionRequest.to_params`), the LSP server checks its settings with :func:`check_option`,
and the config file's bounds for the same settings come from here (``config.RULES``).
"""

from __future__ import annotations

import math
from functools import cache
from dataclasses import dataclass, field, fields
from typing import Any

from .errors import InvalidParams

LAYOUTS = ("efim", "fim")


def _param(default: Any, kind: type, help: str, lo: float | None = None, hi: float | None = None,
           choices: tuple | None = None, cli: bool = True) -> Any:
    """An option field with what validation and the CLI need to know about it."""
    return field(default=default, metadata={"kind": kind, "lo": lo, "hi": hi, "choices": choices,
                                            "help": help, "cli": cli})


@dataclass(frozen=True)
class Position:
    """Where to complete: a document, its path, and the cursor (an offset in code points)."""

    text: str
    cursor: int
    path: str = "<buffer>"


@dataclass(frozen=True)
class Options:
    """How to complete. ``None``: the engine's configured default."""

    max_tokens: int | None = _param(None, int, "Most tokens to generate (default: the config's).", 0, 4096)
    temperature: float = _param(0.0, float, "Sampling temperature; 0 is greedy and exact.", 0, 5)
    top_k: int = _param(0, int, "Sample among the k most likely tokens (0: all).", 0, 1000)
    top_p: float = _param(1.0, float, "Nucleus sampling threshold.", 0, 1)
    seed: int = _param(0, int, "Sampling seed.", 0, (1 << 32) - 1)
    layout: str | None = _param(None, str, "Prompt layout (default: the model's; efim, docs/models.md).",
                                choices=LAYOUTS)
    stop_at_newline: bool = _param(False, bool, "Stop at the end of the first line.")
    max_lines: int | None = _param(None, int, "Stop after this many lines.", 1, 1000)
    type_over: bool = _param(False, bool, "Type over the auto-paired closers after the cursor: the answer "
                             "goes on past them and replaces them (the reply's replaces).")
    max_prompt_ms: float | None = _param(None, float, "Latency budget for the prompt in ms: a larger prompt "
                                         "is reduced to the context nearest the cursor (0: no budget; "
                                         "default: the config's).", 0, 600_000)
    ignore_eog: bool = _param(False, bool, "Always generate max_tokens (benchmarks).", cli=False)
    heal: bool | None = _param(None, bool, "Token healing: re-choose the partial word at the cursor "
                               "(default: on; docs/models.md).")
    sparse: bool | None = _param(None, bool, "InfiniGen sparse restore of long saved states "
                                 "(default: the config's).", cli=False)

    @classmethod
    @cache  # (read at every request)
    def fields(cls) -> tuple[tuple[str, Any, dict], ...]:
        """The option fields: (name, default, metadata), in order."""
        return tuple((f.name, f.default, f.metadata) for f in fields(cls))

    @classmethod
    def rule(cls, name: str) -> dict:
        """The metadata (kind, bounds, choices, help) of one option."""
        return next(meta for n, _, meta in cls.fields() if n == name)

    @classmethod
    def from_params(cls, params: dict) -> "Options":
        """Validate JSON-RPC params; ``null`` is "not given", unknown keys are the caller's business."""
        return cls(**{name: check(name, params[name], meta) for name, _, meta in cls.fields()
                      if params.get(name) is not None})

    def to_params(self) -> dict:
        """The fields that differ from their defaults, as JSON-RPC params."""
        return {name: getattr(self, name) for name, default, _ in self.fields() if getattr(self, name) != default}


@dataclass(frozen=True, init=False)
class CompletionRequest:
    """One completion: where (``where``) and how (``how``).

    ``CompletionRequest(text, cursor, path=..., max_tokens=...)`` builds both at once."""

    where: Position
    how: Options

    def __init__(self, text: str, cursor: int, path: str = "<buffer>", **options: Any):
        object.__setattr__(self, "where", Position(text, cursor, path))
        object.__setattr__(self, "how", Options(**options))

    @classmethod
    def of(cls, where: Position, how: Options | None = None) -> "CompletionRequest":
        req = cls.__new__(cls)
        object.__setattr__(req, "where", where)
        object.__setattr__(req, "how", how or Options())
        return req

    @property
    def text(self) -> str:
        return self.where.text

    @property
    def cursor(self) -> int:
        return self.where.cursor

    @property
    def path(self) -> str:
        return self.where.path

    @classmethod
    def options(cls) -> tuple[tuple[str, Any, dict], ...]:
        """The option fields: (name, default, metadata), in order."""
        return Options.fields()

    @classmethod
    def from_params(cls, params: dict, text: str, cursor: int, path: str) -> "CompletionRequest":
        """Validate JSON-RPC params (unknown keys are the caller's business)."""
        return cls.of(Position(text, cursor, path), Options.from_params(params))

    def to_params(self) -> dict:
        """The options that differ from their defaults, as JSON-RPC params."""
        return self.how.to_params()


def check(name: str, v: Any, meta: dict) -> Any:
    """One value, checked against a field's metadata (kind, lo, hi, choices); raises InvalidParams."""
    kind = meta["kind"]
    if kind is float:
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        what = "a finite number"
    elif kind is int:
        ok, what = isinstance(v, int) and not isinstance(v, bool), "an integer"
    else:
        ok, what = isinstance(v, kind), kind.__name__
    if not ok:
        raise InvalidParams(f"invalid params: {name!r} must be {what}")
    lo, hi, choices = meta.get("lo"), meta.get("hi"), meta.get("choices")
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise InvalidParams(f"invalid params: {name!r} must be in [{lo}, {hi}]")
    if choices and v not in choices:
        raise InvalidParams(f"invalid params: {name!r} must be one of {', '.join(map(repr, choices))}")
    return float(v) if kind is float else v


def check_option(name: str, v: Any) -> Any:
    """One request option checked against its definition (InvalidParams if it is out of bounds)."""
    return check(name, v, Options.rule(name))
