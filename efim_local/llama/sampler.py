"""Owning wrapper for a ``llama_sampler`` chain."""

from __future__ import annotations

from dataclasses import dataclass

from ._handle import Handle
from ._lib import lib


@dataclass(frozen=True)
class SamplerParams:
    temperature: float = 0.0  # 0: greedy
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1: off
    seed: int = 0


class Sampler(Handle):
    """Greedy when temperature is 0; otherwise top-k → top-p → temperature → dist."""

    def __init__(self, params: SamplerParams = SamplerParams()):
        self.params = params
        chain = lib.llama_sampler_chain_init(lib.llama_sampler_chain_default_params())
        if params.temperature <= 0:
            lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_greedy())
        else:
            if params.top_k > 0:
                lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_top_k(params.top_k))
            if params.top_p < 1.0:
                lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_top_p(params.top_p, 1))
            lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_temp(params.temperature))
            lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_dist(params.seed & 0xFFFFFFFF))
        self.ptr = chain
        self._open = True

    def _free(self) -> None:
        lib.llama_sampler_free(self.ptr)
        self.ptr = None

    def sample(self, ctx, row: int) -> int:
        """Sample from the logits at ``row`` of the last batch (and accept the token)."""
        return lib.llama_sampler_sample(self.ptr, ctx.ptr, row)
