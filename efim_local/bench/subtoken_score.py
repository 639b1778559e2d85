"""Scoring for the sub-token evaluation (subtoken.py): the probability that the model's output begins
with given bytes, computed exactly through llama.cpp and batched over many sequences (the definitions
are in subtoken.py's docstring and docs/models.md)."""

from __future__ import annotations

import bisect
import ctypes
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from ..llama import Batch, Context, Model
from ..llama._lib import lib
from ..prompt import healing
from ..prompt.healing import Healer
from .subtoken import LN2, Job, is_word


# -- scoring ------------------------------------------------------------------------------------------
def lse(x: np.ndarray) -> float:
    """log-sum-exp (natural log)."""
    m = float(np.max(x))
    return m + float(np.log(np.sum(np.exp(x - m))))


class Vocabulary:
    """Token sets by their bytes, built on the engine's Healer (same pieces, same sort)."""

    def __init__(self, model: Model):
        self.model = model
        self.healer = Healer.of_model(model)

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
            st.update(r=r, heal=v.healer.extends(r))
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
