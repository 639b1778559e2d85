"""Small owning wrappers over llama.cpp's C API (through ``llama_cpp``).

Layering, as llama-cpp-python does it: raw bindings (``llama_cpp``) → these
handle classes (one per llama.cpp object, freed deterministically) → the
engine (``efim_local.engine``).
"""

import importlib

from .errors import BackendError, DecodeError, Interrupted, ModelError, NoKvSlot

_LAZY = {"Model": "model", "Context": "context", "ContextParams": "context", "Batch": "batch",
         "Sampler": "sampler", "SamplerParams": "sampler"}

__all__ = ["BackendError", "DecodeError", "Interrupted", "ModelError", "NoKvSlot", *_LAZY]


def __getattr__(name: str):
    # Lazy: the errors and the GGUF metadata keys (meta.py) are needed by commands that never load
    # llama.cpp (fast CLI start-up); the handle classes load it.
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
