"""llama.cpp failures: members of the one error tree (``efim_local.errors``)."""

from ..errors import BackendError, DecodeError, Interrupted, ModelError, NoKvSlot

__all__ = ["BackendError", "DecodeError", "Interrupted", "ModelError", "NoKvSlot"]
