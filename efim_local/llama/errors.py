"""llama.cpp failures: members of the one error tree (``efim_local.errors``)."""

from ..errors import BackendError, DecodeError, ModelError, NoKvSlot

__all__ = ["BackendError", "DecodeError", "ModelError", "NoKvSlot"]
