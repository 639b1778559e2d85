"""The completion request, defined once, and the completion it gets.

Every way in builds a :class:`CompletionRequest` from this one definition:
the library API constructs it directly, the daemon validates JSON-RPC params
with :meth:`CompletionRequest.from_params` (one-line ``InvalidParams`` errors,
see docs/protocol.md), and the CLI turns the same fields into options
(``efim_local.cli.request_options``) and back into params for the daemon
(:meth:`CompletionRequest.to_params`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from ..errors import InvalidParams

LAYOUTS = ("efim", "fim")


def _param(default: Any, kind: type, help: str, lo: float | None = None, hi: float | None = None,
           choices: tuple | None = None, cli: bool = True) -> Any:
    """A request field with what validation and the CLI need to know about it."""
    return field(default=default, metadata={"kind": kind, "lo": lo, "hi": hi, "choices": choices,
                                            "help": help, "cli": cli})


@dataclass(frozen=True)
class CompletionRequest:
    """One completion: a document, a cursor and how to complete there."""

    text: str
    cursor: int  # offset in code points
    path: str = "<buffer>"
    max_tokens: int | None = _param(None, int, "Most tokens to generate (default: the config's).", 0, 4096)
    temperature: float = _param(0.0, float, "Sampling temperature; 0 is greedy and exact.", 0, 5)
    top_k: int = _param(0, int, "Sample among the k most likely tokens (0: all).", 0, 1000)
    top_p: float = _param(1.0, float, "Nucleus sampling threshold.", 0, 1)
    seed: int = _param(0, int, "Sampling seed.", 0, (1 << 32) - 1)
    layout: str | None = _param(None, str, "Prompt layout (default: the model's; efim, docs/models.md).",
                                choices=LAYOUTS)
    stop_at_newline: bool = _param(False, bool, "Stop at the end of the first line.")
    max_lines: int | None = _param(None, int, "Stop after this many lines.", 1, 1000)
    max_prompt_ms: float | None = _param(None, float, "Latency budget for the prompt in ms: a larger prompt "
                                         "is reduced to the context nearest the cursor (0: no budget; "
                                         "default: the config's).", 0, 600_000)
    ignore_eog: bool = _param(False, bool, "Always generate max_tokens (benchmarks).", cli=False)
    heal: bool | None = _param(None, bool, "Token healing: re-choose the partial word at the cursor "
                               "(default: on; docs/models.md).")
    sparse: bool | None = _param(None, bool, "InfiniGen sparse restore of long saved states "
                                 "(default: the config's).", cli=False)

    @classmethod
    def options(cls):
        """The optional fields: (name, default, metadata), in order."""
        return [(f.name, f.default, f.metadata) for f in fields(cls) if f.metadata]

    @classmethod
    def from_params(cls, params: dict, text: str, cursor: int, path: str) -> "CompletionRequest":
        """Validate JSON-RPC params (unknown keys are the caller's business)."""
        kw = {}
        for name, _default, meta in cls.options():
            v = params.get(name)
            if v is None:
                continue
            kw[name] = check(name, v, meta)
        return cls(text=text, cursor=cursor, path=path, **kw)

    def to_params(self) -> dict:
        """The optional fields that differ from their defaults, as JSON-RPC params."""
        return {name: getattr(self, name) for name, default, _ in self.options()
                if getattr(self, name) != default}


def check(name: str, v: Any, meta: dict) -> Any:
    """One parameter, checked against its field's metadata; raises InvalidParams."""
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
    lo, hi, choices = meta["lo"], meta["hi"], meta["choices"]
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise InvalidParams(f"invalid params: {name!r} must be in [{lo}, {hi}]")
    if choices and v not in choices:
        raise InvalidParams(f"invalid params: {name!r} must be one of {', '.join(map(repr, choices))}")
    return float(v) if kind is float else v


@dataclass
class TokenCounts:
    prompt: int = 0
    cached: int = 0
    evaluated: int = 0
    generated: int = 0


@dataclass
class Timings:
    prompt_ms: float = 0.0  # planning + prefill + first token
    predict_ms: float = 0.0
    total_ms: float = 0.0
    plan_ms: float = 0.0  # planning alone (tokenizing the middle, anchoring)


@dataclass
class Completion:
    """What a request got: the text, why it stopped, and where its KV came from."""

    text: str
    stop_reason: str
    layout: str
    tokens: TokenCounts = field(default_factory=TokenCounts)
    timings: Timings = field(default_factory=Timings)
    reanchor: str | None = None
    slot: int = -1
    cache_tier: str = "none"  # where the reused KV came from: slot, ram, disk or none
    trimmed: dict = field(default_factory=dict)
    context: dict = field(default_factory=dict)  # tokens of prefix and suffix used; reduced by the budget?
    sparse: dict | None = None  # the sparse restore's report (approximate!), or why it fell back
    token_ids: list[int] = field(default_factory=list)

    def to_json(self) -> dict:
        d = asdict(self)
        d.pop("token_ids")
        d["timings"] = {k: round(v, 2) for k, v in d["timings"].items()}  # 10 µs: more is noise
        return d
