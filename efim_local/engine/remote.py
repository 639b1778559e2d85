"""The engine's side of a remote backend (``backend/``): a token prompt run by a replica, answered as
an in-process run is (stop rules, streaming text, cancellation, the same Completion).

Two ways to run with replicas:

- remote only (:class:`RemoteEngine`): the model is loaded ``vocab_only`` (its tokenizer, no
  weights, no context): planning, anchors and stop rules are local, decoding is the replicas';
- replicas first, the local model behind them (``local_fallback``): the full engine, with a pool
  attached; a request every replica failed runs in-process.

Either way the engine's backend is ``backends.Replicas``; the two differ only in what the engine
loads and builds for decoding here (``RemoteEngine`` overrides those two steps of the constructor).
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
from .decode import ends
from .engine import Engine
from .models import describe
from .policy import Policy
from .slots import SlotManager
from .speed import PrefillSpeed

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
    """An engine whose decoding is the replicas': the vocabulary only, no weights, no context. It is
    built as any engine is (``Engine.__init__``): only its model and what decoding takes differ."""

    decoder = None  # no local decoding (background work asks)
    local_model = False  # a request every replica failed fails (nothing runs it here)

    def __init__(self, config: Config, model_path: str | Path, policy: Policy | None = None):
        super().__init__(config, model_path, policy=policy, pool=lambda model: open_pool(config, model))

    def _open_model(self, stack: ExitStack, model_path: str | Path) -> Model:
        """The model's vocabulary only: planning, anchors and stop rules are local."""
        return stack.enter_context(Model(model_path, vocab_only=True))

    def _open_decoding(self, stack: ExitStack, model_path: str | Path, store):
        """No local KV. Type-through, accept and the answer cache need none: the replica's slot holds
        the prompt and the answer's tokens, and the trail is the ids the server named."""
        self.sparse = self.store = self.cores = self.speed_file = None
        self.slots, self.reuse = SlotManager(0), _NoReuse()
        self.swa, self.swa_strategy, self.n_stream = False, "remote", 0
        self.speed, self._saved_speed = PrefillSpeed(policy=self.policy), 0
        return self._ends

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
                "backend": self.backend.status()}


def open_remote(config: Config, model_path: str | Path, store=None, policy: Policy | None = None) -> Engine:
    """The engine for a config with ``backend`` URLs: remote only, or with the local model behind."""
    if not config.local_fallback:
        return RemoteEngine(config, model_path, policy)
    # The engine opens the pool once its model is loaded (the ids the replicas name are checked against
    # its vocabulary), and takes the replicas' healing and speed (Engine.__init__).
    return Engine(config, model_path, store=store, policy=policy, pool=lambda model: open_pool(config, model))

