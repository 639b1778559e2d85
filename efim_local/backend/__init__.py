"""Remote backends: efim's plans run by the engines a team already runs.

The planner, the tokenizer (the model's vocabulary, loaded ``vocab_only``), healing, anchors, the
daemon and the LSP server stay local; only token arrays cross the wire. Two drivers:

- llama-server ``/completion`` (``drivers.LlamaServer``): ``prompt`` as a token array,
  ``cache_prompt``, ``id_slot`` pinned per file from a local slot map, the server's cached tokens
  checked against the reuse the slot map expected;
- OpenAI-compatible token-prompt engines (``drivers.OpenAI``: vLLM, SGLang): ``/v1/completions``
  with ``prompt`` as token ids and an ``x-session-id`` header for cache-aware routers.

``pool.Pool`` spreads files over replicas (consistent hashing on the session key, one file on one
replica), streams each call on its own thread (the engine thread never waits on the network), and
fails over to the next replica. The engine's side of it is ``engine/remote.py``.

Layer: above ``prompt``/``kv`` and below ``engine``; it imports only ``errors`` and ``kv.prefix``.
"""

from .drivers import DRIVERS, Sampling
from .pool import Call, Pool
from .wire import Replica, ReplicaError

__all__ = ["DRIVERS", "Call", "Pool", "Replica", "ReplicaError", "Sampling"]
