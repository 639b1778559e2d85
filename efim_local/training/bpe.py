"""Byte-level BPE tokenizers with FIM special tokens, trained with ``tokenizers``.

The pre-tokenizer is GPT-2's regex, which llama.cpp implements as the
``gpt-2`` pre-tokenizer, so ids match between training and inference.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Iterable

EOT = "<|endoftext|>"
FIM_PRE, FIM_SUF, FIM_MID, FIM_PAD, FILE_SEP = (
    "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|fim_pad|>", "<|file_sep|>")
SPECIALS = (EOT, FIM_PRE, FIM_SUF, FIM_MID, FIM_PAD, FILE_SEP)


@dataclass(frozen=True)
class BpeVocab:
    """What a GGUF needs of a BPE tokenizer."""

    tokens: list[str]  # byte-level token strings, by id
    merges: list[str]  # "a b" pairs, by rank
    special: dict[str, int]  # special token text -> id
    pre: str = "gpt-2"  # llama.cpp pre-tokenizer name


def train(texts: Iterable[str], vocab_size: int, specials: tuple[str, ...] = SPECIALS):
    """Train a byte-level BPE; returns a ``tokenizers.Tokenizer``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(specials), show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def to_vocab(tok) -> BpeVocab:
    """Export a trained byte-level BPE ``tokenizers.Tokenizer`` (or its JSON) for GGUF."""
    spec = json.loads(tok.to_str() if hasattr(tok, "to_str") else tok)
    model = spec["model"]
    if model.get("type") != "BPE":
        raise ValueError(f"only BPE tokenizers are supported, not {model.get('type')!r}")
    vocab: dict[str, int] = dict(model["vocab"])
    for added in spec.get("added_tokens", []):
        vocab[added["content"]] = added["id"]
    tokens = [""] * (max(vocab.values()) + 1)
    for text, i in vocab.items():
        tokens[i] = text
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    special = {a["content"]: a["id"] for a in spec.get("added_tokens", []) if a.get("special")}
    return BpeVocab(tokens, merges, special, _pre_tokenizer(spec.get("pre_tokenizer") or {}))


def _pre_tokenizer(pre: dict) -> str:
    """llama.cpp's name for a tokenizer.json pre-tokenizer we know; ValueError otherwise."""
    kinds = [pre] + list(pre.get("pretokenizers", []))
    if any(k.get("type") == "ByteLevel" and k.get("use_regex", True) for k in kinds) and \
            not any(k.get("type") == "Split" for k in kinds):
        return "gpt-2"
    patterns = [str(k.get("pattern", {}).get("Regex", "")) for k in kinds if k.get("type") == "Split"]
    if any("\\p{N}{1,3}" in p for p in patterns):
        return "llama-bpe"
    raise ValueError("unsupported pre-tokenizer in tokenizer.json (supported: GPT-2 byte level, Llama 3)")
