"""Loads llama_cpp once, initialises the backend and routes its log to Python logging."""

from __future__ import annotations

import ctypes
import logging
import os
import threading

from ..errors import BackendError, ConfigError, one_line

try:
    import llama_cpp as lib
except (OSError, RuntimeError) as _e:  # a missing or broken libllama: one line, never a traceback
    if os.environ.get("LLAMA_CPP_LIB_PATH"):
        raise ConfigError(one_line(f"LLAMA_CPP_LIB_PATH={os.environ['LLAMA_CPP_LIB_PATH']}: "
                                   f"cannot load llama.cpp: {_e}")) from None
    raise BackendError(one_line(f"cannot load llama.cpp: {_e}")) from None

log = logging.getLogger("efim.llama")
log.setLevel(logging.ERROR)  # llama.cpp is chatty; lower this to debug it
# Its errors go where the process's logging goes (the daemon's log), never to a bare stderr: a
# command that fails says so in one line of its own (a corrupt GGUF printed three of llama.cpp's).
log.addHandler(logging.NullHandler())
_lock = threading.Lock()
_ready = False

# ggml_log_level: NONE=0, DEBUG=1, INFO=2, WARN=3, ERROR=4, CONT=5.
_LEVELS = {1: logging.DEBUG, 2: logging.DEBUG, 3: logging.WARNING, 4: logging.ERROR}


# What llama.cpp logs as errors when a decode is aborted (GGML_STATUS_ABORTED = 1, llama_decode's 2):
# an interrupted background batch (Context.interrupt), which is routine, not an error.
_ABORTED = (b"failed with error 1", b"compute status: 1", b"failed to decode, ret = 2")


@lib.llama_log_callback
def _log_cb(level, text, _user):  # pragma: no cover - called from C
    lvl = _LEVELS.get(level, logging.DEBUG)
    if text and lvl == logging.ERROR and any(a in text for a in _ABORTED):
        lvl = logging.DEBUG
    if text and log.isEnabledFor(lvl):
        log.log(lvl, text.decode("utf-8", "replace").rstrip())


def ensure_backend() -> None:
    """Initialise llama.cpp's backend once per process (idempotent, thread-safe)."""
    global _ready
    with _lock:
        if not _ready:
            lib.llama_log_set(_log_cb, ctypes.c_void_p(0))
            lib.llama_backend_init()
            _ready = True


def library_info() -> dict:
    """Which llama.cpp library is loaded: its path, whether it came from ``LLAMA_CPP_LIB_PATH``
    (a custom build such as native/'s CUDA one) or llama-cpp-python's own, and GPU offload."""
    custom = os.environ.get("LLAMA_CPP_LIB_PATH")
    return {"library": library_path(),
            "library_source": f"LLAMA_CPP_LIB_PATH={custom}" if custom else "llama-cpp-python",
            "gpu_offload": bool(lib.llama_supports_gpu_offload())}


def library_path() -> str:
    """Path of the shared library actually loaded (honours LLAMA_CPP_LIB_PATH)."""
    try:
        return str(lib.llama_cpp._lib._name)  # type: ignore[attr-defined]
    except AttributeError:
        return "unknown"
