"""What an engine reports about itself (``efim status`` and the daemon's status)."""

from __future__ import annotations

from ..llama._lib import library_info
from ..prompt.templates import family_of
from .models import describe
from .reduction import prefill_tok_s


class StatusReport:
    """What an engine reports about itself; its engine builds it and owns it (``engine.status_report``)."""

    def __init__(self, engine):
        self.engine = engine

    def sparse_status(self) -> str:
        """'off', 'on: budget 20%' or 'unavailable: <reason>' (InfiniGen sparse restore)."""
        engine = self.engine
        if engine.config.sparse_budget <= 0:
            return "off"
        if engine.sparse.reason:
            return f"unavailable: {engine.sparse.reason}"
        return f"on: budget {engine.config.sparse_budget:.0%} of states >= {engine.sparse.min_tokens} tokens"

    def slot_info(self) -> list[dict]:
        engine = self.engine
        return [{"slot": s.seq, "path": s.path, "tokens": len(s.tokens), "job": s.job, "phase": s.phase}
                for s in engine.slots.slots]

    def measure_cores(self) -> None:
        """A fresh count of the CPU other processes take (a wait of up to ``Policy.cpu_probe_s``; not on the
        engine's thread): the engine's own last window may be a long pause's, or none yet."""
        engine = self.engine
        cores = getattr(engine, "cores", None)
        if cores is not None:
            cores.measure()

    def budget_status(self) -> dict:
        """The latency budget, the prefill speed learned (tokens/s for ``reduction.SPEED_TOKENS`` on an
        empty slot) and the new tokens the budget prefills at it."""
        engine = self.engine
        budget, speed = engine.config.max_prompt_ms, engine.speed
        return {"max_prompt_ms": budget, "prefill_tok_s": prefill_tok_s(speed),
                "budget_tokens": speed.max_new(budget) if budget > 0 and speed.known else None}

    def fim_family(self) -> str | None:
        """The family of the model's FIM tokens (their stop tokens are the family's), by the marker's text."""
        engine = self.engine
        pre = engine.template.markers.pre
        return family_of(engine.model.piece(pre[0], special=True)) if len(pre) == 1 and engine.model else None

    def engine_status(self) -> dict:
        """What is loaded and how it is used."""
        engine = self.engine
        ctx = engine.config.context
        cores = engine.cores
        return {
            "model": str(engine.model.path), "description": describe(engine.model), **library_info(),
            "layout": engine.default_layout, "layout_reason": engine.layout_reason,
            "heal": engine.default_heal, "heal_reason": engine.heal_reason,
            "fragment_trained": engine.fragment_trained, "fim_family": self.fim_family(),
            "template": engine.template.source, "n_slots": ctx.n_slots, "n_ctx_seq": ctx.n_ctx_seq,
            "threads": engine.ctx.n_threads, "threads_batch": engine.ctx.n_threads_batch,
            "threads_auto": cores is not None, "cores": cores.cores if cores else None,
            "cores_free": cores.free if cores else None,
            "cores_used_by_others": round(cores.others, 2) if cores else None,
            **self.budget_status(),
            "type_k": ctx.type_k, "type_v": ctx.type_v,
            "flash_attn": ctx.flash_attn, "offload_kqv": ctx.offload_kqv,
            "sliding_window": engine.model.n_swa, "swa_strategy": engine.swa_strategy,
            "state_restore": "whole-state checkpoints" if engine.swa else "longest prefix",
            "sparse_restore": self.sparse_status(),
            "drafts": {"on": engine.decoder.drafting, **engine.decoder.draft_stats.as_dict()},
            "slots": self.slot_info(),
            "store": engine.store.stats() if engine.store else None,
            "backend": engine.backend.status(),
        }
