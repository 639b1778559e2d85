"""The engine's side of a remote backend (``backend/``): a token prompt run by a replica, answered as
an in-process run is (stop rules, streaming text, cancellation, the same Completion).

Two ways to run with replicas:

- remote only (:class:`RemoteEngine`): the model is loaded ``vocab_only`` (its tokenizer, no
  weights, no context): planning, anchors and stop rules are local, decoding is the replicas';
- replicas first, the local model behind them (``local_fallback``): the full engine, with a pool
  attached; a request every replica failed runs in-process.
"""

from __future__ import annotations

import functools
import logging
import os
from contextlib import ExitStack
from pathlib import Path

from ..backend import Pool
from ..config import Config
from ..llama import Model
from ..prompt.healing import Healer
from .background import Growth
from .decode import ends
from .engine import Engine, make_planner
from .files import Files
from .instant import Instant, Trail, model_key
from .models import KIND_FRAGMENT, choose_layout, describe, model_kind, remote_heal
from .pace import Pace
from .policy import Policy
from .run import Runner
from .slots import SlotManager
from .speed import PrefillSpeed
from .status import StatusReport

log = logging.getLogger("efim.engine")


def api_key(config: Config) -> str | None:
    """The API key: ``EFIM_API_KEY`` or the config's (never logged, never in status)."""
    return os.environ.get("EFIM_API_KEY") or config.api_key or None


def open_pool(config: Config, model: Model) -> Pool:
    """The replicas of ``config``; the ids they name are checked against ``model``'s vocabulary."""
    return Pool(list(config.backend), config.backend_api, api_key(config), config.backend_model,
                n_vocab=model.n_vocab, timeout=config.backend_timeout_ms / 1e3)


class _NoReuse:
    """What a remote-only engine has instead of local KV reuse: nothing to save or peek."""

    store = None

    def flush(self) -> None:
        pass

    def peek(self, prompt) -> int:
        return 0

    def clear(self, slot) -> None:
        pass

    def drop_others(self, path, prompt) -> None:
        pass


class RemoteEngine(Engine):
    """An engine whose decoding is the replicas': the vocabulary only, no weights, no context."""

    decoder = None  # no local decoding (background work asks)

    def __init__(self, config: Config, model_path: str | Path, policy: Policy | None = None):
        self.config = config
        self.policy = policy = Policy() if policy is None else policy
        with ExitStack() as stack:
            self.model = stack.enter_context(Model(model_path, vocab_only=True))
            self.template, self.planner = make_planner(self.model, config)
            self.remote = open_pool(config, self.model)
            # No local KV. Type-through, accept and the answer cache need none: the replica's slot
            # holds the prompt and the answer's tokens, and the trail is the ids the server named.
            self.sparse = self.store = self.cores = self.speed_file = None
            self.instant = Instant(self.model, model_key(model_path), self._ends, config.answer_cache)
            self.trail = Trail(self)
            self.slots, self.files, self.reuse = SlotManager(0), Files(), _NoReuse()
            self.swa, self.swa_strategy, self.n_stream = False, "remote", 0
            self.speed, self._saved_speed = PrefillSpeed(policy=policy), 0
            self.pace, self.patience_s = Pace(policy), 0.0  # (no local batches: idle work never holds for a request)
            self.runner, self.growth, self.status_report = Runner(self), Growth(self), StatusReport(self)
            self.fragment_trained = model_kind(self.model.meta) == KIND_FRAGMENT
            self.default_layout, self.layout_reason = choose_layout(
                self.model.meta, config.layout, self.template.source == "text")
            self.default_heal, self.heal_reason = remote_heal(self.remote, self.model.meta,
                                                              self.template.source == "text", config.heal)
            self._stack = stack.pop_all()

    @functools.cached_property
    def healer(self) -> Healer:
        return Healer.of_model(self.model)

    def _ends(self, tok: int) -> bool:
        return ends(self.model, self.template.stop_tokens, tok)

    def fit_threads(self) -> None:
        pass

    def interruptible(self, on: bool) -> None:
        pass

    def interrupt(self) -> None:
        pass

    def flush(self) -> None:
        pass

    def status(self) -> dict:
        return {"model": str(self.model.path), "description": describe(self.model), "vocab_only": True,
                "layout": self.default_layout, "layout_reason": self.layout_reason,
                "heal": self.default_heal, "heal_reason": self.heal_reason, "template": self.template.source,
                "n_slots": 0, "n_ctx_seq": self.config.context.n_ctx_seq, "slots": [], "store": None,
                "backend": self.remote.status()}


def open_remote(config: Config, model_path: str | Path, store=None, policy: Policy | None = None) -> Engine:
    """The engine for a config with ``backend`` URLs: remote only, or with the local model behind."""
    if not config.local_fallback:
        return RemoteEngine(config, model_path, policy)
    # The engine opens the pool once its model is loaded (the ids the replicas name are checked against
    # its vocabulary), and takes the replicas' healing and speed (Engine.__init__).
    return Engine(config, model_path, store=store, policy=policy, pool=lambda model: open_pool(config, model))

