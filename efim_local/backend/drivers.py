"""What a token prompt looks like on the wire, per kind of server, and what its stream says back.

A driver builds one streaming request (``request``) and reads each event of its stream
(``parse``) into a :class:`Chunk`: text (exactly what the server decoded: llama-server holds back a
token that ends inside a UTF-8 character and sends it with the next, so text, not token ids, is
what adds up), the ids it names, and at the end what the server reused of its prompt cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .wire import Replica, ReplicaError


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
    def parse(msg: dict) -> Chunk:
        c = Chunk(text=msg.get("content") or "", ids=list(msg.get("tokens") or ()))
        if msg.get("stop"):
            t = msg.get("timings") or {}
            c.final, c.stop = True, msg.get("stop_type")
            c.cached, c.evaluated, c.generated = t.get("cache_n"), t.get("prompt_n"), t.get("predicted_n")
            c.prompt_ms = t.get("prompt_ms")
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
        n = props.get("total_slots")
        return n if isinstance(n, int) and n > 0 else 1


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
    def parse(msg: dict) -> Chunk:
        c = Chunk()
        choices = msg.get("choices") or []
        if choices:
            ch = choices[0]
            c.text = ch.get("text") or ""
            c.stop = ch.get("finish_reason")
        usage = msg.get("usage")
        if usage:  # the last event (stream_options.include_usage)
            c.final = True
            details = usage.get("prompt_tokens_details") or {}
            c.cached = details.get("cached_tokens")
            prompt = usage.get("prompt_tokens")
            if c.cached is not None and prompt is not None:
                c.evaluated = prompt - c.cached
            c.generated = usage.get("completion_tokens")
        return c

    @staticmethod
    def slots(replica: Replica) -> int:
        return 1


DRIVERS = {"llama-server": LlamaServer, "openai": OpenAI}
