class BackendError(RuntimeError):
    """A llama.cpp call failed."""


class ModelError(BackendError):
    """The model file could not be loaded (missing, not GGUF, unsupported)."""


class NoKvSlot(BackendError):
    """llama_decode returned 1: no room in the KV cache. Recoverable: free cells and retry."""


class DecodeError(BackendError):
    """llama_decode failed fatally (negative return code) or was aborted."""
