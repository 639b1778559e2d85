"""What a request gets: the completion, its token counts and its timings."""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field, fields


# Where an answer came from: computed; keystroke (begun at its keystroke, before the request came);
# type-through (the shown answer typed on); accept (the continuation computed while it was shown);
# cache (the same plan answered before).
SOURCES = ("computed", "keystroke", "type-through", "accept", "cache")


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


@dataclass(frozen=True)
class Prompt:
    """The tokens a completion decoded, the text backed off them that it spelled out first, and the
    closers it stopped at: what "the same plan computed cold" runs (``Engine.run``)."""

    tokens: tuple[int, ...] = ()
    heal: bytes = b""
    closers: str = ""


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
    cache_tier: str = "none"  # where the reused KV came from: slot, ram, disk, remote or none
    trimmed: dict = field(default_factory=dict)
    context: dict = field(default_factory=dict)  # tokens of prefix and suffix used; reduced by the budget?
    sparse: dict | None = None  # the sparse restore's report (approximate!), or why it fell back
    token_ids: list[int] = field(default_factory=list)
    remote: dict | None = None  # a remote backend's answer: replica, slot, expected and served reuse, miss
    source: str = "computed"  # where the answer came from: one of SOURCES
    replaces: int = 0  # characters after the cursor the text replaces: the closers it typed over (type_over)
    prompt: Prompt = field(default_factory=Prompt)

    def to_json(self) -> dict:
        # Not asdict: it would deep-copy the prompt's thousands of tokens one by one, to drop them
        # (2 ms of every reply on a 2,400-token prompt).
        d = {f.name: copy.deepcopy(getattr(self, f.name)) for f in fields(self)
             if f.name not in ("token_ids", "prompt")}
        d["tokens"] = asdict(self.tokens)
        d["timings"] = {k: round(v, 2) for k, v in asdict(self.timings).items()}  # 10 µs: more is noise
        if d["remote"] is None:
            d.pop("remote")
        if not d["replaces"]:  # only an answer that typed over closers replaces text
            d.pop("replaces")
        return d
