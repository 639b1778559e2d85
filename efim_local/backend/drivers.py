"""What a token prompt looks like on the wire, per kind of server, and what its stream says back.

A driver builds one streaming request (``request``) and reads each event of its stream
(``parse``) into a :class:`Chunk`: text (exactly what the server decoded: llama-server holds back a
token that ends inside a UTF-8 character and sends it with the next, so text, not token ids, is
what adds up), the ids it names, and at the end what the server reused of its prompt cache.

Nothing a server sends is trusted: every event is parsed into typed values checked against what the
request allows (:class:`Bounds`: token ids in ``[0, n_vocab)``, counts from 0 to the prompt's length or
the tokens asked for, finite times) before anything uses it; anything else is a ``protocol``
ReplicaError, which fails that replica for that request. This module is the only reader of what a
server says (its events, ``/props``, slot restores).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .wire import Replica, ReplicaError

MAX_SLOTS = 4096  # slots a server may say it runs (the slot map scans them on each request)
MAX_MS = 3_600_000.0  # a server time past an hour is not a time
MAX_TOKENS = 1 << 24  # tokens a restored slot file may hold (more than any context)
MAX_PIECE = 1024  # characters of one token's text (a vocabulary's longest pieces have a few hundred bytes)


@dataclass(frozen=True)
class Sampling:
    """How to sample, as the in-process sampler does (``llama/sampler.py``)."""

    n_predict: int = 64
    temperature: float = 0.0  # 0: greedy
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    ignore_eos: bool = False
    grammar: str | None = None  # GBNF the answer must follow (llama-server; then it comes whole, not streamed)


@dataclass
class Chunk:
    text: str = ""
    ids: list[int] = field(default_factory=list)
    final: bool = False
    cached: int | None = None  # prompt tokens the server reused from its cache (final chunk)
    evaluated: int | None = None  # prompt tokens it computed (final chunk)
    generated: int | None = None
    stop: str | None = None  # the server's stop reason (final chunk)
    prompt_ms: float | None = None  # the server's time on the prompt (final chunk; llama-server)


@dataclass(frozen=True)
class Bounds:
    """What the answer to one request may hold."""

    n_vocab: int  # the local vocabulary's size: the ids llama.cpp here can take
    n_prompt: int  # the prompt's tokens: the most a server can reuse or compute
    n_predict: int  # tokens asked for

    @property
    def most(self) -> int:
        """Tokens a server may generate (llama-server generates one when asked for none: warming)."""
        return max(self.n_predict, 1)


def bad(what: str) -> ReplicaError:
    """A reply that breaks the protocol (``str()``: what was wrong, one line)."""
    what = what[:160]
    return ReplicaError(f"bad reply: {what}", "protocol", what)


def _obj(v, what: str) -> dict:
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise bad(f"{what} is not an object ({type(v).__name__})")
    return v


def _event(v) -> dict:
    if not isinstance(v, dict):
        raise bad(f"an event is not an object ({type(v).__name__})")
    return v


def _text(v, what: str) -> str:
    if v is None:
        return ""
    if not isinstance(v, str):
        raise bad(f"{what} is not a string ({type(v).__name__})")
    return v


def _name(v, what: str) -> str | None:
    """A short name (a stop reason): a string or nothing."""
    if v is not None and not (isinstance(v, str) and len(v) <= 64):
        raise bad(f"{what} is not a short string")
    return v


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _count(v, hi: int, what: str) -> int | None:
    if v is None:
        return None
    if not _int(v) or not 0 <= v <= hi:
        raise bad(f"{what} {v!r:.40} is not a count in [0, {hi}]")
    return v


def _ms(v, what: str) -> float | None:
    if v is None:
        return None
    if not (_int(v) or isinstance(v, float)) or not (math.isfinite(v) and 0 <= v <= MAX_MS):
        raise bad(f"{what} {v!r:.40} is not a time in ms")
    return float(v)


def _ids(v, b: Bounds) -> list[int]:
    if v is None:
        return []
    if not isinstance(v, list) or len(v) > b.most:
        raise bad(f"tokens is not a list of at most {b.most} ids")
    for t in v:
        if not _int(t) or not 0 <= t < b.n_vocab:
            raise bad(f"token id {t!r:.40} is not in [0, {b.n_vocab})")
    return list(v)


class Reader:
    """One stream's events, parsed by its driver and checked against ``bounds`` (ReplicaError
    ``protocol`` on anything else). The events of a stream count together: each that carries text is
    at least one token (an OpenAI stream names none), and a token's text is at most ``MAX_PIECE``
    characters, so a server that streams on and on fails at once, not at the deadline."""

    def __init__(self, driver, bounds: Bounds):
        self.driver, self.bounds = driver, bounds
        self.n_ids = self.n_tokens = self.n_chars = 0

    def __call__(self, msg) -> Chunk:
        c = self.driver.parse(msg, self.bounds)
        most = self.bounds.most
        self.n_ids += len(c.ids)
        self.n_tokens += max(len(c.ids), bool(c.text))
        self.n_chars += len(c.text)
        if self.n_tokens > most:
            raise bad(f"{self.n_tokens} tokens for {most} asked")
        if self.n_chars > MAX_PIECE * most:
            raise bad(f"{self.n_chars} characters of text for {most} tokens")
        return c


class LlamaServer:
    """llama-server's native ``/completion``: token prompt, prompt cache, a pinned slot."""

    name = "llama-server"
    PATH = "/completion"

    @staticmethod
    def request(tokens: list[int], s: Sampling, slot: int | None, session: str) -> tuple[str, dict, dict]:
        # A grammar's answer (a token healed: one token) comes whole: a streamed token that ends
        # inside a UTF-8 character is sent with the next one, so its id would never come.
        body = {"prompt": tokens, "n_predict": s.n_predict, "stream": s.grammar is None, "cache_prompt": True,
                "return_tokens": True, "seed": s.seed, "ignore_eos": s.ignore_eos}
        if slot is not None:
            body["id_slot"] = slot
        if s.grammar is not None:
            body["grammar"] = s.grammar
        if s.temperature <= 0:  # greedy, as the in-process sampler: one candidate, no randomness
            body.update(temperature=0.0, top_k=1, samplers=["top_k"])
        else:  # the in-process chain: top-k, top-p, temperature, dist
            body.update(temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, min_p=0.0,
                        samplers=["top_k", "top_p", "temperature"])
        return LlamaServer.PATH, body, {}

    @staticmethod
    def parse(msg, b: Bounds) -> Chunk:
        """One event of ``/completion`` (checked: ReplicaError ``protocol``)."""
        msg = _event(msg)
        c = Chunk(text=_text(msg.get("content"), "content"), ids=_ids(msg.get("tokens"), b))
        stop = msg.get("stop")
        if stop is not None and not isinstance(stop, bool):
            raise bad("stop is not true or false")
        if stop:
            t = _obj(msg.get("timings"), "timings")
            c.final, c.stop = True, _name(msg.get("stop_type"), "stop_type")
            c.cached = _count(t.get("cache_n"), b.n_prompt, "cache_n")
            c.evaluated = _count(t.get("prompt_n"), b.n_prompt, "prompt_n")
            c.generated = _count(t.get("predicted_n"), b.most, "predicted_n")
            c.prompt_ms = _ms(t.get("prompt_ms"), "prompt_ms")
        return c

    @staticmethod
    def slots(replica: Replica) -> int:
        """How many slots the server runs (``--parallel``); 1 if it does not say."""
        try:
            props = replica.get_json("/props")
        except ReplicaError as e:
            if e.reason in ("http_401", "http_403"):
                raise
            return 1
        n = _obj(props, "/props").get("total_slots")
        if n is not None and (not _int(n) or not 1 <= n <= MAX_SLOTS):
            raise bad(f"total_slots {n!r:.40} is not in [1, {MAX_SLOTS}]")
        return n or 1


class OpenAI:
    """OpenAI-compatible ``/v1/completions`` (vLLM, SGLang): token ids as the prompt, the session in a
    header for cache-aware routers. The engine's own prefix cache does the reuse; which slot is the
    engine's business, so no slot is sent."""

    name = "openai"
    PATH = "/v1/completions"

    def __init__(self, model: str = "default"):
        self.model = model

    def request(self, tokens: list[int], s: Sampling, slot: int | None, session: str) -> tuple[str, dict, dict]:
        body = {"model": self.model, "prompt": tokens, "max_tokens": s.n_predict, "stream": True,
                "stream_options": {"include_usage": True}, "temperature": max(0.0, s.temperature),
                "top_p": s.top_p if s.temperature > 0 else 1.0, "seed": s.seed}
        if s.temperature > 0 and s.top_k > 0:
            body["top_k"] = s.top_k  # vLLM and SGLang take it beside the OpenAI fields
        if s.ignore_eos:
            body["ignore_eos"] = True
        return self.PATH, body, {"x-session-id": session}

    @staticmethod
    def parse(msg, b: Bounds) -> Chunk:
        """One event of ``/v1/completions`` (checked: ReplicaError ``protocol``)."""
        msg, c = _event(msg), Chunk()
        choices = msg.get("choices")
        if choices is not None and not isinstance(choices, list):
            raise bad("choices is not a list")
        if choices:
            ch = _obj(choices[0], "a choice")
            c.text = _text(ch.get("text"), "text")
            c.stop = _name(ch.get("finish_reason"), "finish_reason")
        usage = _obj(msg.get("usage"), "usage")
        if usage:  # the last event (stream_options.include_usage)
            c.final = True
            details = _obj(usage.get("prompt_tokens_details"), "prompt_tokens_details")
            prompt = _count(usage.get("prompt_tokens"), b.n_prompt, "prompt_tokens")
            c.cached = _count(details.get("cached_tokens"), b.n_prompt if prompt is None else prompt,
                              "cached_tokens")
            if c.cached is not None and prompt is not None:
                c.evaluated = prompt - c.cached
            c.generated = _count(usage.get("completion_tokens"), b.most, "completion_tokens")
        return c

    @staticmethod
    def slots(replica: Replica) -> int:
        return 1


def restored(out) -> int | None:
    """The tokens a slot restore says it brought back (``n_restored``; None if it does not say)."""
    return _count(_obj(out, "the restore's answer").get("n_restored"), MAX_TOKENS, "n_restored")


DRIVERS = {"llama-server": LlamaServer, "openai": OpenAI}
