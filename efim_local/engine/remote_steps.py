"""A token prompt run by a remote replica (``backend/``), answered as an in-process run is: stop
rules, streaming text, cancellation, healing, the same Completion (``Runner.run_steps`` hands it to
the engine's backend, ``backends.Replicas``, which runs it here; the engines are in ``remote.py``).

The engine thread never waits on the network: each remote call streams on its own thread
(``backend.pool``); a step here takes what arrived, and when nothing did for any call, waits on the
pool at most ``POLL`` seconds before it yields (a request that comes meanwhile waits no longer).
Idle work (a document opened, the cursor settled) warms the replica's slot with ``n_predict = 0``.

Healing (a token backed off the prompt) is token-identical to in-process: there the first token is
the greedy choice among the tokens that agree with the backed-off text (``prompt/healing.py``); here
one call per healed token asks llama-server for one greedy token under a grammar that admits exactly
those tokens (text that is a prefix of the backed-off text, or starts with it), and the answer goes
on from the prompt plus the healed tokens (which the slot holds: one token computed again).

The latency budget's speed (``engine.speed``) learns from the servers' own prompt timings.
"""

from __future__ import annotations

import getpass
import logging
import time
from dataclasses import asdict, dataclass, field

from ..backend import Sampling
from ..backend.pool import miss_reason
from ..errors import BackendError, Cancelled
from .completion import Completion, Timings, TokenCounts
from .decode import SHOWN, TOKEN
from .stream import StopRules, TextStream

log = logging.getLogger("efim.engine")

POLL = 0.01  # seconds a remote step waits for any call's next event before it yields
STOP_TYPES = {"eos": "eog", "limit": "max_tokens", "length": "max_tokens", "stop": "eog", "failover": "failover"}


def session_key(path: str | None) -> str:
    """``user/path``: one file of one user is one session (the ring and the routers' key)."""
    return f"{getpass.getuser()}/{(path or '<buffer>').lstrip('/')}"


def heal_grammar(heal: bytes) -> str | None:
    """GBNF for a first token that agrees with ``heal``: its text is a prefix of ``heal`` or starts
    with it (None if ``heal`` is not whole UTF-8: a grammar is over characters)."""
    try:
        text = heal.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return 'root ::= "' + "".join(f"\\U{ord(ch):08X}" for ch in text) + '" [^\\x00]*'


@dataclass
class _Run:
    """One request's remote calls: when the first token came, tokens generated, what replicas said."""

    t0: float
    stream: TextStream
    t_first: float | None = None
    n_gen: int = 0
    healed: int = 0
    named: int = 0  # streamed tokens the server named (one that ends inside a character comes unnamed)
    flushed: bool = False  # some text came with the next token's id: an unnamed token's, held back
    calls: int = 0
    first_end: dict | None = None  # the end of the call that took the prompt (the reuse, the prefill time)
    shown: bool = False
    ids: list[int] = field(default_factory=list)  # the tokens generated, as far as the server named them
    report: dict = field(default_factory=lambda: {"failover": []})


class RemoteSteps:
    """An engine's token prompts run by ``pool``'s replicas, as the module's docstring says; its
    backend (``backends.Replicas``) builds it and hands it the prompts. ``fallback``: the engine has
    a local model, which runs a request every replica failed before any text went out."""

    def __init__(self, engine, pool, fallback: bool):
        self.engine, self.pool, self.fallback = engine, pool, fallback

    def run_steps(self, prompt, how, ro, rules: StopRules):
        """Run ``prompt`` on the replicas (steps, as ``Runner.run_steps``); returns a Completion, or
        None when every replica failed before any text went out and the engine has a local model."""
        run = _Run(ro.t0 if ro.t0 is not None else time.perf_counter(), TextStream(rules))
        tokens = prompt.tolist()
        grammar = heal_grammar(ro.heal) if ro.heal and not ro.idle else None
        if ro.heal and not ro.idle and grammar is None:
            log.warning("%s: the healed text %r is not whole UTF-8: not healed", ro.path, ro.heal)
        heal, reason, end = ro.heal if grammar else b"", None, {}
        for tok in (ro.known or ()) if not ro.idle else ():  # type-through: the continuation is known
            if reason is not None or run.n_gen >= rules.max_tokens:
                break
            heal, reason = self._take(how, ro, run, tokens, tok, heal)
        while heal and reason is None and run.n_gen < rules.max_tokens and heal_grammar(heal) is not None:
            got: list[int] = []
            sampling = Sampling(n_predict=1, seed=how.seed, grammar=heal_grammar(heal))
            out = yield self._call_steps(tokens, sampling, ro, run, lambda c, got=got: got.extend(c.ids))
            if out is None:
                return None
            if not got:
                raise BackendError("the server sent no token ids for a healed token")
            heal, reason = self._take(how, ro, run, tokens, got[0], heal)
            run.healed += 1
        if reason is None and (run.n_gen < rules.max_tokens or ro.idle):
            sampling = Sampling(n_predict=0 if ro.idle else rules.max_tokens - run.n_gen, temperature=how.temperature,
                                top_k=how.top_k, top_p=how.top_p, seed=how.seed, ignore_eos=how.ignore_eog)
            out = yield self._call_steps(tokens, sampling, ro, run, lambda c: self._chunk(how, ro, run, c))
            if out is None:
                return None
            reason, end = out
            if reason == "max_tokens" and (end.get("generated") or 0) > run.named and not run.flushed:
                # The last token ended inside a character: llama-server never sends it; in-process, the
                # stream ends with a replacement character for it.
                run.stream.feed(b"\xff")
        tail = run.stream.finish()
        if tail and ro.on_text:
            ro.on_text(tail)
        self._learn(run.first_end or {}, run)
        return _completion(prompt, run, reason or "max_tokens", end)

    def _take(self, how, ro, run: _Run, tokens: list[int], tok: int, heal: bytes) -> tuple[bytes, str | None]:
        """A token known before the stream (type-through, or healed), as ``decode.generate_steps`` takes
        it: the text past the healed part goes out. Returns what is left to heal, and why to stop."""
        engine = self.engine
        raw = engine.model.piece(tok)
        if heal:
            raw, heal = (raw[len(heal):], b"") if raw.startswith(heal) else (b"", heal[len(raw):])
        _trail(ro, run, tok)
        run.t_first = run.t_first or time.perf_counter()
        if not how.ignore_eog and (engine.model.is_eog(tok) or tok in engine.template.stop_tokens):
            return heal, "eog"
        tokens.append(tok)
        run.ids.append(tok)
        run.n_gen += 1
        _show(run, raw, ro)
        return heal, run.stream.stop_reason

    def _chunk(self, how, ro, run: _Run, c) -> str | None:
        """Take a streamed chunk; the reason to stop, if it says one."""
        engine = self.engine
        if not how.ignore_eog and any(t in engine.template.stop_tokens for t in c.ids):
            return "eog"
        flushed = bool(c.ids) and c.text != b"".join(map(engine.model.piece, c.ids)).decode("utf-8", "replace")
        run.flushed = run.flushed or flushed  # the trail stops short of the unnamed token
        for t in c.ids:
            _trail(ro, run, t)
            run.ids.append(t)
        run.n_gen += (len(c.ids) or bool(c.text)) + flushed  # (at least) one unnamed token came with this one
        run.named += len(c.ids) + flushed
        _show(run, c.text.encode("utf-8"), ro)
        return run.stream.stop_reason

    def _call_steps(self, tokens: list[int], sampling: Sampling, ro, run: _Run, on_chunk):
        """One remote call, to its end (steps): returns (stop reason, the end's info), or None when
        every replica failed before any text went out and the engine has a local model."""
        call = self.pool.start(tokens, sampling, session_key(ro.path))
        run.calls += 1
        try:
            while True:
                if ro.should_stop is not None and ro.should_stop():
                    raise Cancelled(data={
                        "tokens": asdict(TokenCounts(prompt=len(tokens), generated=run.n_gen)),
                        "timings": {"prompt_ms": (run.t_first - run.t0) * 1e3}} if run.t_first else None)
                events = call.take()
                run.shown = False
                for kind, data in events:
                    if kind == "replica":  # what the slot map expected is about the prompt: the first call
                        run.report.update(data if run.calls == 1 else {"url": data["url"], "slot": data["slot"]})
                    elif kind == "failover":
                        run.report["failover"].append(data)
                        log.warning("backend %s failed (%s); trying the next", data["url"], data["reason"])
                    elif kind == "error":
                        if ro.idle:  # warming is optional work
                            log.debug("warming a replica failed: %s", data)
                            return "max_tokens", {}
                        if run.stream.text or run.n_gen or not self.fallback:
                            raise data
                        log.warning("%s; running it here", data)
                        return None
                    elif kind == "chunk":
                        run.t_first = run.t_first or time.perf_counter()
                        stop = on_chunk(data)
                        if stop:
                            return stop, {}
                    elif kind == "end":
                        if run.calls == 1:
                            run.first_end = data
                        return STOP_TYPES.get(data.get("stop") or "", "max_tokens"), data
                if not events:
                    self.pool.wait_any(POLL)
                yield SHOWN if run.shown else TOKEN
        finally:
            call.close()

    def _learn(self, end: dict, run: _Run) -> None:
        """The budget's speed learns the servers' prefill: their own prompt time (llama-server), else
        the time to the first token."""
        engine = self.engine
        evaluated, cached = end.get("evaluated"), end.get("cached") or 0
        ms = end.get("prompt_ms")
        if ms is None and run.t_first is not None and not run.report.get("failover"):
            ms = (run.t_first - run.t0) * 1e3
        if evaluated and ms is not None:
            engine.speed.observe(evaluated, cached, ms)


def _trail(ro, run: _Run, tok: int) -> None:
    """The greedy continuation, for the next keystroke (``instant.py``), as long as every token is
    known by its id."""
    if ro.trail is not None and not run.flushed and len(ro.trail) == len(run.ids):
        ro.trail.append(tok)


def _show(run: _Run, raw: bytes, ro) -> None:
    piece = run.stream.feed(raw)
    if piece and ro.on_text:
        ro.on_text(piece)
    run.shown = run.shown or bool(piece)


def _completion(prompt, run: _Run, reason: str, end: dict) -> Completion:
    t2 = time.perf_counter()
    t_first = run.t_first or t2
    first = run.first_end if run.first_end is not None else end  # the prompt's reuse was the first call's
    cached, evaluated = first.get("cached"), first.get("evaluated")
    report = run.report
    # A server that reused less than its slot held lost it (evicted, restarted, another client), or
    # the file's slot went to another file: a miss with its reason, not a silent slowdown.
    report["cached"] = cached
    report["miss"] = miss_reason(report, cached, bool(first))
    counts = TokenCounts(prompt=len(prompt), cached=cached or 0,
                         evaluated=evaluated if evaluated is not None else len(prompt) - (cached or 0),
                         generated=run.n_gen)
    if reason == "max_tokens" and end.get("generated"):  # a token that ended inside a character came unnamed
        counts.generated = max(run.n_gen, run.healed + end["generated"])
    return Completion(text=run.stream.text, stop_reason=reason, layout="tokens", tokens=counts,
                      timings=Timings(prompt_ms=(t_first - run.t0) * 1e3, predict_ms=(t2 - t_first) * 1e3,
                                      total_ms=(t2 - run.t0) * 1e3),
                      slot=report.get("slot") if report.get("slot") is not None else -1,
                      cache_tier="remote" if cached else "none", remote=report, token_ids=list(run.ids),
                      replaces=run.stream.rules.replaced(run.stream.text))
