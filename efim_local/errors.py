"""One error tree for everything a user can see go wrong.

Each class carries its JSON-RPC error code (what the daemon puts on the wire)
and its CLI exit code (what ``efim`` exits with). Exit code 2 means a usage
error: the input was wrong and the same call will fail again. Exit code 1 is
any other failure. The daemon and the CLI translate errors through this tree
only, so no traceback reaches a user.
"""

from __future__ import annotations

from typing import Any

# JSON-RPC 2.0 codes, and the daemon's own (see docs/protocol.md).
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
BUSY = -32001  # the request queue is full: retry later
MODEL_ERROR = -32002  # llama.cpp failed on this request
REQUEST_TOO_LARGE = -32003
CANCELLED = -32800  # cancelled or superseded (LSP's RequestCancelled)


class EfimError(Exception):
    """Base of every efim error. ``str(e)`` is the one-line message shown to users."""

    code = INTERNAL_ERROR
    exit_code = 1
    request_id: Any = None  # a malformed frame's id, when one could be read (to address the reply)

    def __init__(self, message: str = "", data: Any = None):
        super().__init__(message)
        self.message, self.data = message, data

    def to_json(self) -> dict:
        err = {"code": self.code, "message": self.message}
        if self.data is not None:
            err["data"] = self.data
        return err


# -- usage errors: the input is wrong (exit 2; on the wire, invalid params) --------------
class UsageError(EfimError):
    code, exit_code = INVALID_PARAMS, 2


class InvalidParams(UsageError):
    """A request parameter is missing, of the wrong type or out of range."""


class DocumentError(UsageError):
    """A document or cursor position is unusable (missing file, not UTF-8, cursor outside)."""


class PlanError(UsageError):
    """The request cannot be planned (unknown layout, context too small)."""


class ConfigError(UsageError):
    """config.toml, an environment variable or an option is invalid."""


class TemplateError(UsageError):
    """The model has no usable FIM template for the request."""


# -- protocol errors (the daemon's wire) -------------------------------------------------
class ParseError(EfimError):
    code = PARSE_ERROR


class InvalidRequest(EfimError):
    code = INVALID_REQUEST


class MethodNotFound(EfimError):
    code = METHOD_NOT_FOUND


class RequestTooLarge(EfimError):
    code = REQUEST_TOO_LARGE


class Busy(EfimError):
    code = BUSY


class Cancelled(EfimError):
    """A request was cancelled or superseded; the prompt work done so far stays in its slot."""

    code = CANCELLED

    def __init__(self, message: str = "cancelled", data: Any = None):
        super().__init__(message, data)


class Interrupted(Cancelled):
    """Background work stopped inside a batch because a request came: that batch's KV was dropped,
    the batches before it stay in the slot."""

    lost_s = 0.0  # seconds of work the stopped batch had done

    def __init__(self, message: str = "interrupted by a request", data: Any = None):
        super().__init__(message, data)


# -- llama.cpp ---------------------------------------------------------------------------
class BackendError(EfimError):
    """A llama.cpp call failed."""

    code = MODEL_ERROR


class ModelError(BackendError):
    """The model file could not be loaded (missing, not GGUF, unsupported): the path is wrong."""

    exit_code = 2


class DownloadError(EfimError):
    """A model download failed (network, unknown repository or file, no access)."""


class NoKvSlot(BackendError):
    """llama_decode returned 1: no room in the KV cache. Recoverable: free cells and retry."""


class DecodeError(BackendError):
    """llama_decode failed fatally (negative return code) or was aborted."""


# -- the KV state store ------------------------------------------------------------------
class StoreError(EfimError):
    """The state store cannot be used (an index from a newer efim, an unusable directory)."""


class StateFileError(StoreError):
    """A state file is corrupt, truncated, foreign or of another format version; it is dropped,
    never restored. ``reason``: "corrupt" | "model_changed" | "layout_changed" | "old_format"."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


# -- the daemon --------------------------------------------------------------------------
class DaemonError(EfimError):
    """Starting, reaching or stopping the daemon failed."""


class DaemonUnavailable(DaemonError, ConnectionError):
    """No daemon answers on the socket."""


class AlreadyRunning(DaemonError):
    """Another daemon holds the socket."""


class Unsupported(EfimError):
    """A sparse restore cannot apply to this state; ``reason`` is a short code, e.g. ``kv_type``."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


class InternalError(EfimError):
    """A bug: reported as one line, logged with its traceback."""


_BY_CODE = {c.code: c for c in (ParseError, InvalidRequest, MethodNotFound, InvalidParams, InternalError,
                                Busy, BackendError, RequestTooLarge, Cancelled)}


def from_wire(err: dict) -> EfimError:
    """The error a daemon's JSON-RPC error object stands for (client side)."""
    code = err.get("code") if isinstance(err, dict) else None
    msg = err.get("message") if isinstance(err, dict) else None
    cls = _BY_CODE.get(code, EfimError)
    data = err.get("data") if isinstance(err, dict) else None
    e = cls(msg if isinstance(msg, str) else "malformed error from the daemon", data)
    if cls is EfimError:
        e.code = code if isinstance(code, int) else INTERNAL_ERROR
    return e


def internal(exc: BaseException) -> EfimError:
    """``exc`` as an EfimError: itself if it is one, else an InternalError naming its class."""
    if isinstance(exc, EfimError):
        return exc
    return InternalError(one_line(f"internal error: {exc.__class__.__name__}: {exc}".rstrip(": ")))


def one_line(text: str) -> str:
    """``text`` with its line breaks folded into spaces (what a user sees is one line)."""
    return " ".join(text.split())
