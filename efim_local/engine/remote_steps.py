"""A token prompt run by a remote replica (``backend/``), answered as an in-process run is: stop
rules, streaming text, cancellation, the same Completion (``run.run_steps`` hands it over when the
engine has replicas; the engines themselves are in ``remote.py``).

The engine thread never waits on the network: each remote call streams on its own thread
(``backend.pool``); a step here takes what arrived, and when nothing did for any call, waits on the
pool at most ``POLL`` seconds before it yields (a request that comes meanwhile waits no longer).
Idle work (a document opened, the cursor settled) warms the replica's slot with ``n_predict = 0``.
"""

from __future__ import annotations

import getpass
import logging
import time
from dataclasses import asdict

from ..backend import Sampling
from ..backend.pool import miss_reason
from ..errors import Cancelled
from .completion import Completion, Timings, TokenCounts
from .decode import SHOWN, TOKEN
from .stream import StopRules, TextStream

log = logging.getLogger("efim.engine")

POLL = 0.01  # seconds a remote step waits for any call's next event before it yields
STOP_TYPES = {"eos": "eog", "limit": "max_tokens", "length": "max_tokens", "stop": "eog", "failover": "failover"}


def session_key(path: str | None) -> str:
    """``user/path``: one file of one user is one session (the ring and the routers' key)."""
    return f"{getpass.getuser()}/{(path or '<buffer>').lstrip('/')}"


def remote_steps(engine, prompt, how, ro, rules: StopRules):
    """Run ``prompt`` on ``engine.remote`` (steps, as ``run.run_steps``); returns a Completion, or
    None when every replica failed before any text went out and the engine has a local model."""
    t0 = ro.t0 if ro.t0 is not None else time.perf_counter()
    sampling = Sampling(n_predict=0 if ro.idle else rules.max_tokens, temperature=how.temperature, top_k=how.top_k,
                        top_p=how.top_p, seed=how.seed, ignore_eos=how.ignore_eog)
    call = engine.remote.start(prompt.tolist(), sampling, session_key(ro.path))
    stream, report = TextStream(rules), {"failover": []}
    stop_ids = engine.template.stop_tokens
    t_first, reason, n_gen, end = None, "max_tokens", 0, None
    try:
        while end is None:
            if ro.should_stop is not None and ro.should_stop():
                raise Cancelled(data={"tokens": asdict(TokenCounts(prompt=len(prompt), generated=n_gen)),
                                      "timings": {"prompt_ms": (t_first - t0) * 1e3}} if t_first else None)
            events = call.take()
            shown = False
            for kind, data in events:
                if kind == "replica":
                    report.update(data)
                elif kind == "failover":
                    report["failover"].append(data)
                    log.warning("backend %s failed (%s); trying the next", data["url"], data["reason"])
                elif kind == "error":
                    if ro.idle:  # warming is optional work
                        log.debug("warming a replica failed: %s", data)
                        end = {}
                        break
                    if stream.text or getattr(engine, "ctx", None) is None:
                        raise data
                    log.warning("%s; running it here", data)
                    return None
                elif kind == "chunk":
                    t_first = t_first or time.perf_counter()
                    if not how.ignore_eog and any(t in stop_ids for t in data.ids):
                        reason, end = "eog", {}
                        break
                    n_gen += len(data.ids) or bool(data.text)
                    piece = stream.feed(data.text.encode("utf-8"))
                    if piece and ro.on_text:
                        ro.on_text(piece)
                    shown = shown or bool(piece)
                    if stream.stop_reason:
                        reason, end = stream.stop_reason, {}
                        break
                elif kind == "end":
                    end = data
                    reason = STOP_TYPES.get(data.get("stop") or "", "max_tokens")
                    break
            if end is None:
                if not events:
                    engine.remote.wait_any(POLL)
                yield SHOWN if shown else TOKEN
    finally:
        call.close()
    tail = stream.finish()
    if tail and ro.on_text:
        ro.on_text(tail)
    return _completion(prompt, stream, reason, report, end, n_gen, t0, t_first)


def _completion(prompt, stream, reason, report, end, n_gen, t0, t_first) -> Completion:
    t2 = time.perf_counter()
    first = t_first or t2
    cached, evaluated = end.get("cached"), end.get("evaluated")
    # A server that reused less than its slot held lost it (evicted, restarted, another client), or
    # the file's slot went to another file: a miss with its reason, not a silent slowdown.
    report["cached"] = cached
    report["miss"] = miss_reason(report, cached, bool(end))
    counts = TokenCounts(prompt=len(prompt), cached=cached or 0,
                         evaluated=evaluated if evaluated is not None else len(prompt) - (cached or 0),
                         generated=end.get("generated") or n_gen)
    counts.generated = min(counts.generated, n_gen) if reason != "max_tokens" else counts.generated
    return Completion(text=stream.text, stop_reason=reason, layout="tokens", tokens=counts,
                      timings=Timings(prompt_ms=(first - t0) * 1e3, predict_ms=(t2 - first) * 1e3,
                                      total_ms=(t2 - t0) * 1e3),
                      slot=report.get("slot") if report.get("slot") is not None else -1,
                      cache_tier="remote" if cached else "none", remote=report)
