"""The sub-token evaluation's pieces (scripts/eval_subtoken.py): cursors at mid-word and word-boundary
positions, prompts built the engine's way, and the probability of the true continuation computed
exactly through llama.cpp, batched over many sequences.

What a score is (docs/models.md, "Sub-token evaluation", defines it for readers):

- ``P(s | prompt)`` is the probability that the model's output *begins with* the bytes ``s``. The
  first token is summed over every token consistent with ``s`` (a proper prefix of ``s``, or a token
  that starts with ``s``); after a first token that is a proper prefix, the rest of ``s`` follows its
  canonical tokenization, and the last step sums over every token starting with the last piece (so a
  target that ends mid-token is not penalised). At temperature 0 this is what the engine samples from.
- *Unhealed* (U): ``P(target | prompt)``, the prompt as the planner builds it, a partial word included.
- *Healed* (H): the engine's token healing (prompt/healing.py): the last typed token ``r`` is backed
  off and every step that has not yet spelled ``r`` out is renormalised over the tokens healing
  allows; ``P_H(r + target)``.
- *Oracle* (O): the exact conditional on the healed prompt, ``P(r + target) / P(r)``: what the
  model believes of the target given the typed text, with no token cut at the cursor. ``U - O`` (in
  bits) is the sub-token loss; ``(U - H) / (U - O)`` is the share of it healing recovers.
"""

from __future__ import annotations

import bisect
import ctypes
import random
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from ..llama import Batch, Context, Model
from ..llama._lib import lib
from ..prompt import healing
from ..prompt.healing import Healer
from ..prompt.planner import Planner, line_start

CLASSES = ("mid-word", "boundary")
LN2 = float(np.log(2.0))


# -- cursors ----------------------------------------------------------------------------------------
def is_word(ch: str) -> bool:
    return ch.isascii() and (ch.isalnum() or ch == "_")


def cursor_class(text: str, i: int) -> str | None:
    """'mid-word' (a word character on both sides), 'boundary' (a word starts here after a space or
    punctuation on the same line), or None."""
    if not 0 < i < len(text) or not is_word(text[i]):
        return None
    if is_word(text[i - 1]):
        return "mid-word"
    return "boundary" if text[i - 1] not in "\r\n" else None


@dataclass(frozen=True)
class Cursor:
    """A cursor in a document: ``hole`` (the rest of its line) is what the user has not typed yet."""

    corpus: str
    doc: int
    offset: int
    cls: str
    line_start: int
    eol: int  # end of the cursor's line (the newline's index)

    def hole(self, text: str) -> str:
        return text[self.offset:self.eol]

    def word(self, text: str) -> str:
        """The rest of the word at the cursor (the whole next word at a boundary)."""
        h = self.hole(text)
        n = 0
        while n < len(h) and is_word(h[n]):
            n += 1
        return h[:n]


def sample_cursors(texts: Sequence[str], cls: str, n: int, rng: random.Random, corpus: str = "",
                   max_line: int = 160) -> list[Cursor]:
    """``n`` distinct cursors of class ``cls``, uniformly over the characters of ``texts`` (rejection
    sampling), on ASCII lines of at most ``max_line`` characters."""
    sizes = np.cumsum([len(t) for t in texts])
    seen: set[tuple[int, int]] = set()
    out: list[Cursor] = []
    for _ in range(n * 400):
        k = rng.randrange(int(sizes[-1]))
        doc = int(np.searchsorted(sizes, k, side="right"))
        text = texts[doc]
        i = k - (int(sizes[doc - 1]) if doc else 0)
        if (doc, i) in seen or cursor_class(text, i) != cls:
            continue
        ls, eol = line_start(text, i), text.find("\n", i)
        eol = len(text) if eol < 0 else eol
        if eol - ls > max_line or not text[ls:eol].isascii():
            continue
        seen.add((doc, i))
        out.append(Cursor(corpus, doc, i, cls, ls, eol))
        if len(out) == n:
            return out
    raise ValueError(f"only {len(out)} {cls} cursors found in {corpus or 'the corpus'}")


# -- prompts ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Job:
    """One cursor under one prompt layout: what to score and what greedy decoding must produce."""

    prompt: tuple[int, ...]  # the engine's prompt, partial word included
    cut: int | None  # index of the typed text's last token (what healing backs off); None: nothing typed
    target: bytes  # scored: the true next characters
    hole: bytes  # the rest of the line: greedy exact match
    word: bytes  # the rest of the word: greedy exact match


def window_tokens(tokenize: Callable[[str], list[int]], text: str, n: int, tail: bool) -> list[int]:
    """At most ``n`` tokens of ``text``'s end (``tail``) or start, tokenized from a window of 8
    characters a token (the window's cut-off first token is dropped, as a trimmed prefix drops it)."""
    window = 8 * n
    if tail:
        piece = text[-window:] if len(text) > window else text
        toks = tokenize(piece)
        if len(piece) < len(text):
            toks = toks[1:]
        return toks[-n:] if n else []
    piece = text[:window]
    toks = tokenize(piece)
    if len(piece) < len(text):
        toks = toks[:-1]
    return toks[:n]


def infill_job(planner: Planner, text: str, cur: Cursor, layout: str, n_prefix: int, n_suffix: int,
               n_target: int) -> Job:
    """The planner's prompt for a cursor typed into the hole: anchored at the line start, the typed
    part of the line as the middle (after the middle marker for EFIM, ending the prefix for FIM), the
    document after the line as the suffix. Pieces are tokenized separately, as the planner does."""
    tok = planner.tokenize
    prefix = window_tokens(tok, text[:cur.line_start], n_prefix, tail=True)
    middle = tok(text[cur.line_start:cur.offset])
    suffix = window_tokens(tok, text[cur.eol:], n_suffix, tail=False)
    tokens = planner.assemble(layout, prefix, middle, suffix)
    cut = None
    if middle:
        m = planner.markers
        if layout == "efim":
            cut = len(tokens) - 1
        elif m.order == "psm":
            cut = len(m.bos) + len(m.pre) + len(prefix) + len(middle) - 1
        else:
            cut = len(m.bos) + len(m.suf) + len(suffix) + len(m.pre) + len(prefix) + len(middle) - 1
    return _job(tokens, cut, text, cur, n_target)


def l2r_job(model: Model, text: str, cur: Cursor, n_prefix: int, n_target: int) -> Job:
    """A left-to-right prompt: BOS and the last ``n_prefix`` tokens before the cursor, in one piece."""
    toks = window_tokens(model.tokenize, text[:cur.offset], n_prefix, tail=True)
    tokens = (*model.bos, *toks)
    return _job(tokens, len(tokens) - 1 if toks else None, text, cur, n_target)


def _job(tokens, cut, text: str, cur: Cursor, n_target: int) -> Job:
    hole = cur.hole(text)
    return Job(tuple(tokens), cut, hole[:n_target].encode(), hole.encode(), cur.word(text).encode())


# -- scoring ------------------------------------------------------------------------------------------
def lse(x: np.ndarray) -> float:
    """log-sum-exp (natural log)."""
    m = float(np.max(x))
    return m + float(np.log(np.sum(np.exp(x - m))))


class Vocabulary:
    """Token sets by their bytes, built on the engine's Healer (same pieces, same sort)."""

    def __init__(self, model: Model):
        self.model = model
        self.healer = Healer([model.piece(t) for t in range(model.n_vocab)])

    def piece(self, t: int) -> bytes:
        return self.model.piece(t)

    def cover(self, s: bytes) -> np.ndarray:
        """Tokens whose bytes start with ``s``."""
        h = self.healer
        lo = bisect.bisect_left(h.keys, s)
        hi = bisect.bisect_left(h.keys, s + b"\xff" * 8)
        return h.ids[lo:hi]

    def proper_prefixes(self, s: bytes) -> list[int]:
        """Tokens whose bytes are a proper (non-empty) prefix of ``s``."""
        return [i for k in range(1, len(s)) for i in self.healer.by_piece.get(s[:k], ())]

    def allowed(self, r: bytes) -> np.ndarray:
        """What token healing lets the model choose while ``r`` is still to be spelled out."""
        return self.healer.allowed(r)


@dataclass
class Path:
    """Ways to begin the output with some bytes ``s``: a first token (or set of tokens that all start
    with ``s``), then the canonical tokens of the rest, the last step summed over its cover."""

    first: np.ndarray  # the first step's token set
    first_piece: bytes  # its bytes (for a cover set: s itself)
    rest: list[int]  # canonical tokens after the first, fed except the last
    steps: list[tuple[np.ndarray, bytes]] = field(default_factory=list)  # (set, bytes) after the first


def paths(vocab: Vocabulary, s: bytes) -> list[Path]:
    """Every first token consistent with ``s``; see the module docstring."""
    out = [Path(vocab.cover(s), s, [])] if len(vocab.cover(s)) else []
    for t in vocab.proper_prefixes(s):
        p = vocab.piece(t)
        rest = vocab.model.tokenize(s[len(p):].decode("utf-8", "replace"))
        if b"".join(vocab.piece(x) for x in rest) != s[len(p):]:
            continue  # not representable (cannot happen for ASCII text)
        steps = [(np.array([x]), vocab.piece(x)) for x in rest[:-1]]
        last = vocab.piece(rest[-1])
        steps.append((vocab.cover(last), last))
        out.append(Path(np.array([t]), p, rest[:-1], steps))
    return out


def path_logp(vocab: Vocabulary, rows: list[np.ndarray], path: Path, heal: bytes) -> float:
    """Natural-log probability of ``path`` from ``rows`` (logits before each step); steps taken while
    ``heal`` is not yet spelled out are renormalised over what healing allows (none when empty)."""
    total = 0.0
    for row, (ids, piece) in zip(rows, [(path.first, path.first_piece), *path.steps]):
        z = lse(row[vocab.allowed(heal)]) if heal else lse(row)
        total += lse(row[ids]) - z
        heal = heal[len(piece):] if len(piece) < len(heal) else b""
    return total


@dataclass
class Result:
    """Scores of one job, in bits (log2 probabilities of the target, negated)."""

    bits_u: float
    bits_h: float
    bits_o: float
    chars: int
    healed: bool  # the engine would heal here
    em_word_u: bool
    em_line_u: bool
    em_word_h: bool
    em_line_h: bool


@dataclass
class _Greedy:
    """A greedy decode checked against the truth as it goes; stops at the first wrong byte."""

    seq: int
    pos: int
    heal: bytes
    truth: bytes  # the hole
    word: bytes
    text: bytes = b""
    done: bool = False
    eog: bool = False

    def feed(self, piece: bytes, eog: bool) -> None:
        if eog:
            self.eog = self.done = True
            return
        if self.heal:  # as Decoder.generate consumes backed-off text
            h = self.heal
            piece, self.heal = (piece[len(h):], b"") if piece.startswith(h) else (b"", h[len(piece):])
        self.text += piece
        t, h = self.text, self.truth
        if not (h + b"\n").startswith(t[:len(h) + 1]) or len(t) > len(h):
            self.done = True

    def matches(self, want: bytes) -> bool:
        """The output is ``want`` followed by a word end (a non-word byte, the line's end, or EOG)."""
        t = self.text
        if not t.startswith(want):
            return False
        nxt = t[len(want):len(want) + 1]
        if not nxt:
            return self.eog  # the output ended right after the word
        return not is_word(nxt.decode("latin-1"))

    def exact(self) -> tuple[bool, bool]:
        line = self.text.split(b"\n", 1)[0] == self.truth and (self.eog or b"\n" in self.text)
        return self.matches(self.word), line


class Scorer:
    """Scores jobs on one model, many sequences per llama_decode (a unified KV cache, the prompt's
    cells shared among a job's sequences)."""

    def __init__(self, model: Model, ctx: Context, stop_tokens: frozenset[int] = frozenset(),
                 max_seqs: int = 64, max_new: int = 40, capacity: int | None = None):
        self.model, self.ctx = model, ctx
        self.vocab = Vocabulary(model)
        self.stop_tokens = stop_tokens
        self.capacity = min(capacity or ctx.n_batch, ctx.n_batch)
        self.batch = Batch(self.capacity, max_seqs)
        self.max_seqs, self.max_new = max_seqs, max_new

    def is_stop(self, t: int) -> bool:
        return self.model.is_eog(t) or t in self.stop_tokens

    # A pending row: (token, pos, seqs, callback for its logits or None).
    def _run(self, rows: list[tuple[int, int, tuple[int, ...], Callable | None]]) -> None:
        b = self.batch
        for start in range(0, len(rows), self.capacity):
            part = rows[start:start + self.capacity]
            b.clear()
            raw = b.raw
            for i, (tok, pos, seqs, cb) in enumerate(part):
                raw.token[i], raw.pos[i], raw.n_seq_id[i] = tok, pos, len(seqs)
                for k, s in enumerate(seqs):
                    raw.seq_id[i][k] = s
                raw.logits[i] = cb is not None
            raw.n_tokens = len(part)
            self.ctx.decode(b)
            for i, (_, _, _, cb) in enumerate(part):
                if cb is not None:
                    cb(self._row(i))

    def _row(self, i: int) -> np.ndarray:
        ptr = lib.llama_get_logits_ith(self.ctx.ptr, i)
        floats = ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float))
        return np.ctypeslib.as_array(floats, shape=(self.model.n_vocab,)).copy()

    def score(self, jobs: Sequence[Job]) -> list[Result | None]:
        """Score ``jobs`` in groups that fit the batch and the sequence limit. A job that alone needs
        more sequences than ``max_seqs`` (a target with very many token prefixes, e.g. a rule of
        dashes) is not scored: None in its place."""
        out: list[Result | None] = [None] * len(jobs)
        group: list[tuple[int, dict]] = []
        cost = seqs = 0

        def flush():
            for (i, _), r in zip(group, self._group([st for _, st in group])):
                out[i] = r

        for i, job in enumerate(jobs):
            st = self._prepare(job)
            c = len(job.prompt) + sum(len(p.steps) for k in st["plans"] for p in st[k]) + 2 * self.max_new
            s = st["n_seqs"]
            if s > self.max_seqs:
                continue
            if group and (cost + c > self.capacity or seqs + s > self.max_seqs):
                flush()
                group, cost, seqs = [], 0, 0
            group.append((i, st))
            cost, seqs = cost + c, seqs + s
        if group:
            flush()
        return out

    def _prepare(self, job: Job) -> dict:
        """The conditions of a job: for each, its prompt, the text healing must spell out, the bytes
        scored and their paths."""
        v = self.vocab
        st: dict = {"job": job, "r": b"", "heal": False}
        plans = {"u": (job.prompt, b"", job.target)}
        if job.cut is not None:  # the typed text's last token: back it off (healing and the oracle)
            r = v.piece(job.prompt[job.cut])
            p_h = job.prompt[:job.cut] + job.prompt[job.cut + 1:]
            st.update(r=r, heal=Healer.should_heal(r))
            plans["h"] = (p_h, r, r + job.target)
            plans["den"] = (p_h, r, r)
        st["plans"] = plans
        for key, (_, _, s) in plans.items():
            st[key] = paths(v, s)
        st["n_seqs"] = 1 + st["heal"] + sum(len(st[k]) for k in plans)
        return st

    def _group(self, group: Sequence[dict]) -> list[Result]:
        self.ctx.clear()
        rows: list = []
        seq = 0
        for st in group:
            job, plans = st["job"], st["plans"]
            seqs: dict[str, tuple[int, ...]] = {}
            for key in plans:
                seqs[key] = tuple(range(seq, seq + len(st[key])))
                seq += len(st[key])
            st["gu"], seq = seq, seq + 1
            st["gh"] = None
            if st["heal"]:
                st["gh"], seq = seq, seq + 1
            st["seqs"] = seqs
            p_u = job.prompt
            p_h = plans["h"][0] if "h" in plans else p_u
            u_seqs = (*seqs["u"], st["gu"])
            h_seqs = (*seqs.get("h", ()), *seqs.get("den", ()), *((st["gh"],) if st["gh"] is not None else ()))
            # The tokens U and H prompts share are decoded once, for all of the job's sequences.
            n_common = 0
            while n_common < min(len(p_u), len(p_h)) and p_u[n_common] == p_h[n_common]:
                n_common += 1
            feed = [(k, p_u[k], u_seqs + h_seqs, "c") for k in range(n_common)]
            feed += [(k, p_u[k], u_seqs, "u") for k in range(n_common, len(p_u))]
            if "h" in plans:
                feed += [(k, p_h[k], h_seqs, "h") for k in range(n_common, len(p_h))]
            for k, tok, tagged, part in feed:
                keys = [key for key, p in (("u", p_u), ("h", p_h))
                        if part in ("c", key) and k == len(p) - 1 and (key == "u" or "h" in plans)]
                cb = (lambda row, st=st, keys=tuple(keys): st.update({f"{x}_row": row for x in keys})) if keys else None
                rows.append((tok, k, tagged, cb))
        self._run(rows)

        v = self.vocab
        rows, greedy = [], []
        for st in group:
            job = st["job"]
            h_row = st.get("h_row")
            for key, (prompt, _, _) in st["plans"].items():
                got_all = []
                for path, s in zip(st[key], st["seqs"][key]):
                    got = [st["u_row"] if key == "u" else h_row]
                    got_all.append(got)
                    fed = [int(path.first[0]), *path.rest] if path.steps else []
                    for k, tok in enumerate(fed):
                        rows.append((tok, len(prompt) + k, (s,), got.append))
                st[key + "_rows"] = got_all
            st["greedy_u"] = _Greedy(st["gu"], len(job.prompt), b"", job.hole, job.word)
            greedy.append((st["greedy_u"], st["u_row"]))
            if st["gh"] is not None:
                st["greedy_h"] = _Greedy(st["gh"], len(job.prompt) - 1, st["r"], job.hole, job.word)
                greedy.append((st["greedy_h"], h_row))
        self._greedy(rows, greedy)

        results = []
        for st in group:
            job = st["job"]

            def total(key: str, heal: bytes, st=st) -> float:
                lps = [path_logp(v, got, p, heal) for p, got in zip(st[key], st[key + "_rows"])]
                return lse(np.array(lps)) if lps else -np.inf

            bits_u = -total("u", b"") / LN2
            bits_h = bits_o = bits_u
            if "h" in st["plans"]:
                bits_o = -(total("h", b"") - total("den", b"")) / LN2
                if st["heal"]:
                    bits_h = -total("h", st["r"]) / LN2
            wu, lu = st["greedy_u"].exact()
            wh, lh = st["greedy_h"].exact() if st["gh"] is not None else (wu, lu)
            results.append(Result(bits_u, bits_h, bits_o, len(job.target), st["heal"], wu, lu, wh, lh))
        return results

    def _greedy(self, rows: list, greedy: list[tuple[_Greedy, np.ndarray]]) -> None:
        """Greedy decoding, checked against the truth; path rows ride along with the first step."""
        pending = list(greedy)
        for _ in range(self.max_new):
            nxt: list = []
            for g, row in pending:
                tok = healing.pick(row, self.vocab.allowed(g.heal)) if g.heal else int(np.argmax(row))
                g.feed(self.vocab.piece(tok), self.is_stop(tok))
                if not g.done:
                    rows.append((tok, g.pos, (g.seq,), lambda r, g=g, nxt=nxt: nxt.append((g, r))))
                    g.pos += 1
            if not rows:
                return
            self._run(rows)
            rows, pending = [], nxt
        for g, _ in pending:
            g.done = True


def bootstrap(values: np.ndarray, weights: np.ndarray | None = None, n: int = 1000, seed: int = 0,
              ratio_of: np.ndarray | None = None) -> tuple[float, float, float]:
    """(estimate, low, high): a 95% percentile bootstrap over cursors of ``sum(values)/sum(weights)``
    (a mean when ``weights`` is None), or of ``sum(values)/sum(ratio_of)`` (a ratio of sums)."""
    values = np.asarray(values, dtype=np.float64)
    den = np.ones_like(values) if weights is None else np.asarray(weights, dtype=np.float64)
    if ratio_of is not None:
        den = np.asarray(ratio_of, dtype=np.float64)
    est = values.sum() / den.sum()
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(values), size=(n, len(values)))
    stats = values[idx].sum(axis=1) / den[idx].sum(axis=1)
    lo, hi = np.percentile(stats, [2.5, 97.5])
    return float(est), float(lo), float(hi)
