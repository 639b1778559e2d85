"""InfiniGen-style sparse restore against full restore of long saved states (`efim bench infinigen`).

One long input (standard-library modules concatenated) is prefilled once; its state, truncated at
several lengths of about ``tokens``, stands for a saved file. Each sample restores it and decodes the
next ``tail`` tokens, then greedily completes a line. At each budget every policy restores only part
of the state (efim_local/kv/sparse/select.py) and is compared with the full restore: bytes restored,
restore time, next-token top-1 agreement, first-line agreement.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from . import util as bu


@dataclass
class InfinigenConfig:
    model: str = "gemma"
    tokens: int = 8192  # state length (the longest sample)
    samples: int = 12
    tail: int = 32  # unseen tokens decoded after the restore
    line_tokens: int = 48  # greedy tokens for the first line
    budgets: tuple[float, ...] = (0.1, 0.2, 0.4)
    alpha: float = 4.0
    queries: int | None = None  # tail tokens rehearsed (None: SelectConfig's)
    threads: int = 0
    out: Path = bu.RESULTS


def skew_of(model_path: Path, log=print):
    """The model's skew sidecar, calibrated first if there is none yet."""
    from ..kv.fingerprint import model_fingerprint
    from ..kv.sparse import skew as skew_mod
    from ..training import corpus

    fp = model_fingerprint(model_path).hex()
    side = skew_mod.sidecar_path(skew_mod.default_dir(), fp)
    if not side.exists():
        if log is not None:
            log("calibrating (no sidecar yet) ...")
        skew_mod.calibrate(model_path, corpus.calibration_text(), fp).save(side)
    return skew_mod.Skew.load(side, fp)


def run(cfg: InfinigenConfig, log=print) -> dict:
    import numpy as np

    from ..kv import kvblob
    from ..kv.sparse.capture import QKCapture
    from ..kv.sparse.restore import SparseRestorer
    from ..kv.sparse.select import POLICIES, SelectConfig, keys_of, partial_keys
    from ..llama import Batch, Context, ContextParams, Model
    from ..training.corpus import stdlib_files

    model_path, _ = bu.bench_model(cfg.model)
    skew = skew_of(model_path, log)
    cap = QKCapture()
    n_ctx = cfg.tokens + cfg.tail + cfg.line_tokens + 64
    params = ContextParams(n_ctx_seq=n_ctx, n_slots=1, n_batch=512, n_threads=cfg.threads)
    text = "".join(p.read_text("utf-8", errors="replace") for p in stdlib_files(3_000_000))
    with Model(model_path) as model, Context(model, params, cap.callback) as ctx, Batch(512) as batch:
        toks = model.tokenize(text)[:cfg.tokens + cfg.tail]
        if len(toks) < cfg.tokens + cfg.tail:
            raise SystemExit("corpus too short")
        restorer = SparseRestorer(ctx, batch, cap, skew, n_stream=1, n_swa=model.n_swa)

        def decode(tokens, pos0, want_logits=True):
            for s in range(0, len(tokens), 512):
                part = tokens[s:s + 512]
                batch.clear()
                for i, t in enumerate(part):
                    batch.add(int(t), pos0 + s + i, 0, logits=want_logits and s + i == len(tokens) - 1)
                ctx.decode(batch)
            return ctx.logits(len(tokens) - 1 - (len(tokens) - 1) // 512 * 512) if want_logits else None

        def answer(tail, pos0):
            """Top-1 after the tail, and the greedy first line."""
            logits = decode(tail, pos0)
            top1 = int(np.argmax(logits))
            out, t, pos = b"", top1, pos0 + len(tail)
            for _ in range(cfg.line_tokens):
                if model.is_eog(t):
                    break
                out += model.piece(t)
                if b"\n" in out:
                    break
                batch.clear()
                batch.add(t, pos, 0, logits=True)
                ctx.decode(batch)
                pos += 1
                t = int(np.argmax(ctx.logits(0)))
            return top1, out.split(b"\n")[0]

        if log is not None:
            log(f"prefilling {cfg.tokens} tokens of {model_path.name} ...")
        t0 = time.perf_counter()
        decode(toks[:cfg.tokens], 0, want_logits=False)
        prefill_s = time.perf_counter() - t0
        full_state = kvblob.normalize(ctx.seq_state(0))
        ctx.seq_rm(0, 0, -1)

        lengths = [cfg.tokens - i * 61 for i in range(cfg.samples)]
        runs = [(b, p) for b in cfg.budgets for p in POLICIES]
        stats = {r: {k: [] for k in ("bytes", "ms", "rehearsal_ms", "select_ms", "top1", "line", "kept")}
                 for r in runs}
        full_ms = []
        for i, n in enumerate(tqdm(lengths, desc="samples", disable=log is None)):
            state = kvblob.truncate(full_state, n)
            blob = kvblob.parse_normalized(state)
            tail = toks[n:n + cfg.tail]
            t0 = time.perf_counter()
            full_bytes = restorer.load(0, blob, np.ones(blob.sections[0].cell_count, bool))
            full_ms.append((time.perf_counter() - t0) * 1e3)
            ref = answer(tail, n)
            ctx.seq_rm(0, 0, -1)
            # Partial keys are saved beside a state when it is saved, so they are not timed here.
            keys = keys_of(blob, skew)
            pkeys = {"infinigen": partial_keys(keys, skew.proj), "noskew": partial_keys(keys, skew.proj_noskew)}
            for b, p in runs[i % len(runs):] + runs[:i % len(runs)]:  # no policy always goes first
                sel = SelectConfig(budget=b, alpha=cfg.alpha, queries=cfg.queries or SelectConfig.queries, policy=p)
                res = restorer.restore(0, state, tail, sel, pkeys.get(p))
                got = answer(tail, n)
                ctx.seq_rm(0, 0, -1)
                s = stats[(b, p)]
                s["bytes"].append(res.bytes_restored / full_bytes)
                s["ms"].append(res.restore_ms)
                s["rehearsal_ms"].append(res.rehearsal_ms)
                s["select_ms"].append(res.select_ms)
                s["kept"].append(res.kept / res.cells)
                s["top1"].append(got[0] == ref[0])
                s["line"].append(got[1] == ref[1])

    rows = [{"budget": f"{int(b * 100)}%", "policy": p,
             "kept_%": 100 * bu.mean(stats[(b, p)]["kept"]),
             "bytes_%": 100 * bu.mean(stats[(b, p)]["bytes"]),
             "restore_ms": bu.mean(stats[(b, p)]["ms"]),
             "rehearsal_ms": bu.mean(stats[(b, p)]["rehearsal_ms"]),
             "select_ms": bu.mean(stats[(b, p)]["select_ms"]),
             "top1_agree_%": 100 * bu.mean(stats[(b, p)]["top1"]),
             "line_agree_%": 100 * bu.mean(stats[(b, p)]["line"])} for b, p in runs]
    res = {"model": str(model_path), "args": bu.options(cfg), "full_restore_ms": bu.mean(full_ms),
           "prefill_s": prefill_s, "rows": rows}
    name = "gemma3-270m" if cfg.model == "gemma" else Path(cfg.model).stem
    res["json"] = str(bu.save(f"infinigen-{name}", res, cfg.out))
    if log is not None:
        log(f"\n{model_path.name}: {cfg.samples} samples of ~{cfg.tokens} tokens, tail {cfg.tail}; "
            f"full restore {res['full_restore_ms']:.1f} ms (prefill was {prefill_s:.1f} s)")
        log(bu.table(rows, list(rows[0])))
    return res
