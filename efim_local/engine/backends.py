"""Where an engine's prompts are decoded: in this process (:class:`Local`), or by replicas first
(:class:`Replicas`, a ``backend.Pool``), with or without the local model behind them.

The engine builds one in its constructor and owns it (``engine.backend``); the parts that behave
differently with replicas ask it what they need, never whether the engine has replicas:

- ``run_steps``: a prompt run elsewhere first (``Runner.run_steps``; locally nothing is);
- ``peek`` / ``stored``: how much of a prompt the KV that serves it holds (the latency budget);
- ``heals``, ``choose_heal``: whether prompts are healed, and the default with its reason;
- ``local_kv``: idle work that computes or keeps local KV for requests runs (keystroke answers,
  the trail ahead, near plans and growth stages, repository builds): with replicas the requests'
  KV is the servers', so that work would be lost (and a team's servers would answer every keystroke);
- ``own_speed``: the budget's prefill speed is this machine's (saved beside the states, it sizes
  the near window); with replicas it is theirs (``remote_steps`` learns it), and local prefills (a
  fallback) learn a speed of their own that nothing asks (``observe``);
- ``status()``: the replicas' state for ``efim status`` (None locally).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .decode import answer_rules
from .models import choose_heal, remote_heal
from .remote_steps import RemoteSteps
from .speed import PrefillSpeed

if TYPE_CHECKING:
    from ..backend import Pool


class Local:
    """Every prompt is decoded here, in the engine's own context and slots."""

    local_kv = True  # (see the module's docstring)
    own_speed = True
    heals = True

    def __init__(self, engine):
        self.engine = engine

    def run_steps(self, prompt, how, ro, rules):
        """Nothing runs elsewhere: returns None at once (steps: ``Runner.run_steps`` goes on here)."""
        return None
        yield  # (a generator, as the replicas' run is)

    def peek(self, tokens) -> int:
        """How much of ``tokens`` a live slot holds."""
        return self.engine.reuse.peek(tokens)

    def stored(self, tokens, path: str | None):
        """What saved states hold of prompts (``Reuse.stored``; restoring one costs milliseconds)."""
        return self.engine.reuse.stored(tokens, path)

    def observe(self, n_new: int, n_ctx: int, ms: float) -> None:
        """A local prefill batch: the budget's speed learns from it."""
        self.engine.speed.observe(n_new, n_ctx, ms)

    def choose_heal(self, meta, text_markers: bool, config_heal: bool | None) -> tuple[bool, str]:
        """Whether to heal by default, and why (``models.choose_heal``)."""
        return choose_heal(meta, text_markers, config_heal)

    def status(self) -> None:
        """No remote backend to report."""
        return None


class Replicas:
    """Prompts run by ``pool``'s replicas first (``remote_steps.py``); ``fallback``: the engine has
    its local model behind them, which runs a request every replica failed."""

    local_kv = False  # (see the module's docstring)
    own_speed = False

    def __init__(self, engine, pool: Pool, fallback: bool):
        self.engine, self.pool, self.fallback = engine, pool, fallback
        self.steps = RemoteSteps(engine, pool, fallback)
        # Local prefills (a fallback) learn this speed, which the budget never asks.
        self.observe = PrefillSpeed(policy=engine.policy).observe

    @property
    def heals(self) -> bool:
        """Whether the servers can heal a token (``Pool.heals``)."""
        return self.pool.heals

    def run_steps(self, prompt, how, ro, rules):
        """Run ``prompt`` on the replicas (steps); returns a Completion, or None: a cold run (it
        ignores all cached KV: here), or every replica failed and the local model answers."""
        if ro.cold:
            return None
        engine = self.engine
        rules = answer_rules(engine.model, engine.template.markers, rules, prompt, ro.heal)
        return (yield self.steps.run_steps(prompt, how, ro, rules))

    def peek(self, tokens) -> int:
        """How much of ``tokens`` some replica's slot is expected to serve from its cache."""
        return self.pool.peek(tokens)

    def stored(self, tokens, path: str | None) -> None:
        """No saved states: a replica's cache is all it holds."""
        return None

    def choose_heal(self, meta, text_markers: bool, config_heal: bool | None) -> tuple[bool, str]:
        """Whether to heal by default, and why, as the servers can (``models.remote_heal``)."""
        return remote_heal(self.pool, meta, text_markers, config_heal)

    def status(self) -> dict:
        """The replicas: which are up, what they served and missed (``Pool.status``)."""
        return self.pool.status()
