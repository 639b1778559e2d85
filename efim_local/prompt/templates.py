"""FIM templates: which marker tokens a model uses, and in which order.

Resolution order:
1. a user template of text markers (for models without FIM tokens);
2. a named family (``qwen``, ``deepseek``, ...), looked up by token text;
3. the FIM token ids stored in the GGUF (``tokenizer.ggml.fim_*_token_id``),
   which llama.cpp also fills in from well-known token texts.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Protocol

from ..errors import TemplateError
from .planner import Markers




@dataclass(frozen=True)
class Family:
    pre: str
    suf: str
    mid: str | None  # None: the prompt ends after the last piece (Codestral)
    order: str = "psm"
    stops: tuple[str, ...] = ()


FAMILIES: dict[str, Family] = {
    "qwen": Family("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>",
                   stops=("<|fim_pad|>", "<|endoftext|>", "<|file_sep|>", "<|repo_name|>")),
    "deepseek": Family("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>",
                       stops=("<｜end▁of▁sentence｜>", "<|EOT|>")),
    "starcoder": Family("<fim_prefix>", "<fim_suffix>", "<fim_middle>",
                        stops=("<fim_pad>", "<|endoftext|>", "<file_sep>")),
    "codellama": Family("▁<PRE>", "▁<SUF>", "▁<MID>", stops=("▁<EOT>",)),
    "codestral": Family("[PREFIX]", "[SUFFIX]", None, order="spm"),
    "codegemma": Family("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", stops=("<|file_separator|>",)),
    "granite": Family("<fim_prefix>", "<fim_suffix>", "<fim_middle>", stops=("<fim_pad>", "<|endoftext|>")),
}
FAMILIES["starcoder2"] = FAMILIES["starcoder"]
FAMILIES["qwen2.5-coder"] = FAMILIES["qwen"]
FAMILIES["deepseek-coder"] = FAMILIES["deepseek"]


@dataclass(frozen=True)
class TextTemplate:
    """FIM markers given as plain text, tokenized like document text."""

    pre: str
    suf: str
    mid: str
    order: str = "psm"
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class Template:
    """A resolved template: marker token ids and the stop rules that go with them."""

    markers: Markers
    stop_tokens: frozenset[int]
    stop_strings: tuple[str, ...]
    source: str  # "gguf", "family:<name>" or "text"


class Vocab(Protocol):
    def fim_ids(self) -> dict[str, int]: ...
    def token_id(self, text: str) -> int | None: ...
    def tokenize(self, text: str, special: bool = False) -> list[int]: ...
    bos: tuple[int, ...]


def parse_order(order: str) -> str:
    order = order.lower()
    if order not in ("psm", "spm"):
        raise TemplateError(f"FIM order must be 'psm' or 'spm', not {order!r}")
    return order


def resolve(vocab: Vocab, family: str | None = None, text: TextTemplate | None = None,
            order: str | None = None) -> Template:
    """Pick the template for a model; raise TemplateError with a one-line reason."""
    if text is not None:
        tok: Callable[[str], tuple[int, ...]] = lambda s: tuple(vocab.tokenize(s))
        markers = Markers(tok(text.pre), tok(text.suf), tok(text.mid), parse_order(order or text.order), vocab.bos)
        return Template(markers, frozenset(), text.stop, "text")

    if family is not None:
        fam = FAMILIES.get(family.lower())
        if fam is None:
            raise TemplateError(f"unknown FIM family {family!r}; known: {', '.join(sorted(FAMILIES))}")
        ids = {k: vocab.token_id(t) for k, t in (("pre", fam.pre), ("suf", fam.suf), ("mid", fam.mid)) if t}
        missing = [k for k, v in ids.items() if v is None]
        if missing:
            raise TemplateError(f"model has no {family} FIM tokens ({', '.join(missing)} missing)")
        stops = frozenset(i for i in (vocab.token_id(s) for s in fam.stops) if i is not None)
        markers = Markers((ids["pre"],), (ids["suf"],), (ids["mid"],) if fam.mid else (),
                          parse_order(order or fam.order), vocab.bos)
        return Template(markers, stops, (), f"family:{family.lower()}")

    fim = vocab.fim_ids()
    if fim.get("pre") is None or fim.get("suf") is None:
        # Codestral stores [PREFIX]/[SUFFIX] without metadata ids.
        if vocab.token_id("[PREFIX]") is not None and vocab.token_id("[SUFFIX]") is not None:
            return resolve(vocab, family="codestral", order=order)
        raise TemplateError(
            "model has no FIM tokens: configure a text template (--fim-template 'PRE,SUF,MID') or a family")
    mid = (fim["mid"],) if fim.get("mid") is not None else ()
    stops = frozenset(v for k, v in fim.items() if k in ("pad", "rep", "sep") and v is not None)
    markers = Markers((fim["pre"],), (fim["suf"],), mid, parse_order(order or ("psm" if mid else "spm")), vocab.bos)
    return Template(markers, stops, (), "gguf")


def family_of(pre: bytes) -> str | None:
    """The FIM family whose prefix marker is the text ``pre`` (None for text markers or unknown ones)."""
    return next((name for name, fam in FAMILIES.items() if fam.pre.encode() == pre), None)


def with_special_texts(template: Template, piece: Callable[[int], bytes], extra: tuple[int, ...] = ()) -> Template:
    """``template`` that also stops at the text of its marker and stop tokens (and ``extra``: the
    model's end tokens) spelled out in plain tokens: a model that writes one has left the middle,
    and an answer never shows one."""
    m = template.markers
    ids = sorted({*m.pre, *m.suf, *m.mid, *template.stop_tokens, *extra})
    texts = [piece(i).decode("utf-8", "replace") for i in ids]
    new = tuple(dict.fromkeys(t for t in texts if len(t) >= 5 and t not in template.stop_strings))
    return replace(template, stop_strings=template.stop_strings + new)


def parse_text_template(spec: str) -> TextTemplate:
    """Parse ``'PRE,SUF,MID'`` (optionally ``',ORDER'``) into a TextTemplate."""
    parts = spec.split(",")
    if len(parts) not in (3, 4) or not all(parts[:3]):
        raise TemplateError("a text template is 'PRE,SUF,MID[,psm|spm]', e.g. '<PRE>,<SUF>,<MID>'")
    order = parse_order(parts[3]) if len(parts) == 4 else "psm"
    return TextTemplate(parts[0], parts[1], parts[2], order, stop=text_stops(parts[:3]))


END_MARKERS = ("<END>", "<EOT>")  # ends a model without FIM training invents after a tag-like middle


def text_stops(markers) -> tuple[str, ...]:
    """Stop strings for text markers: the markers, the closing form of tag-like ones (``</MID>``
    for ``<MID>``: a model that has seen markup closes what it opened), and common end markers."""
    stops = list(markers)
    tags = [m for m in markers if len(m) > 2 and m[0] == "<" and m[-1] == ">" and m[1] != "/"]
    stops += ["</" + m[1:] for m in tags]
    if tags:
        stops += [e for e in END_MARKERS if e not in stops]
    return tuple(stops)
