"""Small owning wrappers over llama.cpp's C API (through ``llama_cpp``).

Layering, as llama-cpp-python does it: raw bindings (``llama_cpp``) → these
handle classes (one per llama.cpp object, freed deterministically) → the
engine (``efim_local.engine``).
"""

from .errors import BackendError, DecodeError, ModelError, NoKvSlot
from .model import Model
from .context import Context, ContextParams
from .batch import Batch
from .sampler import Sampler, SamplerParams

__all__ = ["BackendError", "DecodeError", "ModelError", "NoKvSlot", "Model", "Context", "ContextParams",
           "Batch", "Sampler", "SamplerParams"]
