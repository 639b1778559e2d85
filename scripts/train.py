"""Train a small fragment-tokenized llama model on the Python standard library, then export GGUF.

    python scripts/train.py                       # the default config (about an hour on 2 cores)
    python scripts/train.py --config tiny         # seconds: for tests
    python scripts/train.py --fragment-rate 0     # the no-fragment baseline, for the evaluation

Training data: the standard library's own sources, with its test/ directory
held out for validation. Each sample is plain, FIM (PSM or SPM) or EFIM, and
every piece is fragment-tokenized (efim_local/training/fragments.py). Checkpoints are
safetensors (no pickle); the last one is converted to GGUF.
"""

import argparse
import json
import math
import random
import sysconfig
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from efim_local.training import bpe, convert, fragments
from efim_local.training.gguf_llama import LlamaConfig
from efim_local.training.torch_llama import Llama


@dataclass
class TrainConfig:
    name: str = "efim-stdlib"
    vocab_size: int = 2048  # byte-level BPE trained on the training files
    n_embd: int = 192
    n_layer: int = 4
    n_head: int = 6
    n_head_kv: int = 2  # grouped-query attention keeps the KV cache small
    n_ff: int = 512
    seq_len: int = 256  # tokens per training sequence
    batch: int = 16
    steps: int = 3000
    lr: float = 2e-3  # peak; linear warm-up, cosine decay to lr/10
    warmup: int = 100
    weight_decay: float = 0.1
    fragment_rate: float = 1 / 24  # cut points per character; 0 trains the no-fragment baseline
    corpus_mb: float = 24.0  # training text to read
    eval_every: int = 200
    eval_batches: int = 8
    seed: int = 1234
    bf16: bool = True  # autocast on CPUs with AVX512-BF16
    threads: int = 2


CONFIGS = {
    "default": TrainConfig(),
    "tiny": TrainConfig(name="efim-tiny-trained", vocab_size=512, n_embd=64, n_layer=2, n_head=4, n_head_kv=2,
                        n_ff=160, seq_len=128, batch=8, steps=30, warmup=5, corpus_mb=1.0, eval_every=15,
                        eval_batches=2),
}

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--config", default="default", choices=sorted(CONFIGS))
ap.add_argument("--out", default="out/train", help="checkpoint directory")
ap.add_argument("--gguf", default=None, help="GGUF to write at the end (default: OUT/model.gguf)")
ap.add_argument("--fragment-rate", type=float, default=None)
ap.add_argument("--steps", type=int, default=None)
args = ap.parse_args()
cfg = CONFIGS[args.config]
if args.fragment_rate is not None:
    cfg = replace(cfg, fragment_rate=args.fragment_rate, name=cfg.name + ("" if args.fragment_rate else "-nofrag"))
if args.steps is not None:
    cfg = replace(cfg, steps=args.steps)
out = Path(args.out)
random.seed(cfg.seed)
np.random.seed(cfg.seed)
torch.manual_seed(cfg.seed)
torch.set_num_threads(cfg.threads)

# -- data: stdlib sources, test/ held out ------------------------------------------
root = Path(sysconfig.get_paths()["stdlib"])
skip = ("site-packages", "idlelib", "turtledemo", "lib2to3")
files = [p for p in sorted(root.rglob("*.py")) if p.relative_to(root).parts[0] not in skip]
train_files = [p for p in files if "test" not in p.relative_to(root).parts[:-1]]
val_files = [p for p in files if "test" in p.relative_to(root).parts[:-1]]


def read(paths, limit_mb):
    texts, total = [], 0
    for p in paths:
        t = p.read_text("utf-8", errors="replace")
        texts.append(t)
        total += len(t)
        if total > limit_mb * 1e6:
            break
    return texts


train_texts = read(train_files, cfg.corpus_mb)
val_texts = read(val_files, max(1.0, cfg.corpus_mb / 8))
print(f"train: {len(train_texts)} files, {sum(map(len, train_texts)) / 1e6:.1f} MB; "
      f"validation: {len(val_texts)} files from test/")

tok = bpe.train(train_texts, cfg.vocab_size)
vocab = bpe.to_vocab(tok)
ids_of = {t: vocab.special[t] for t in (bpe.FIM_PRE, bpe.FIM_SUF, bpe.FIM_MID, bpe.EOT)}
sp = fragments.Specials(ids_of[bpe.FIM_PRE], ids_of[bpe.FIM_SUF], ids_of[bpe.FIM_MID], ids_of[bpe.EOT])
tokenize = lambda s: tok.encode(s).ids
sample_cfg = fragments.SampleConfig(fragment_rate=cfg.fragment_rate)


def batch(texts, rng):
    """(inputs, targets) with -100 where no loss is taken."""
    x = np.full((cfg.batch, cfg.seq_len), sp.eot, dtype=np.int64)
    y = np.full((cfg.batch, cfg.seq_len), -100, dtype=np.int64)
    for b in range(cfg.batch):
        text = rng.choice(texts)
        start = rng.randrange(0, max(1, len(text) - cfg.seq_len * 3))
        s = fragments.make_sample(text[start:start + cfg.seq_len * 3], tokenize, sp, rng, sample_cfg)
        ids, loss = s.ids[:cfg.seq_len + 1], s.loss[:cfg.seq_len]
        n = len(ids) - 1
        x[b, :n] = ids[:-1]
        y[b, :n] = np.where(loss[:n], ids[1:], -100)
    return torch.from_numpy(x), torch.from_numpy(y)


# -- model and training -------------------------------------------------------------
mcfg = LlamaConfig(vocab_size=len(vocab.tokens), n_embd=cfg.n_embd, n_layer=cfg.n_layer, n_head=cfg.n_head,
                   n_head_kv=cfg.n_head_kv, n_ff=cfg.n_ff, n_ctx=4096)
model = Llama(mcfg)
print(f"model: {model.n_params() / 1e6:.2f}M parameters, {cfg.steps} steps of {cfg.batch}x{cfg.seq_len} tokens")
decay = [p for p in model.parameters() if p.dim() > 1]
no_decay = [p for p in model.parameters() if p.dim() <= 1]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0}],
                        lr=cfg.lr, betas=(0.9, 0.95))
lr_at = lambda s: cfg.lr * (s + 1) / cfg.warmup if s < cfg.warmup else \
    cfg.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * (s - cfg.warmup) / max(1, cfg.steps - cfg.warmup))))
autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.bf16)
loss_fn = lambda logits, y: torch.nn.functional.cross_entropy(logits.float().view(-1, logits.size(-1)), y.view(-1))


@torch.no_grad()
def evaluate() -> float:
    model.eval()
    rng = random.Random(cfg.seed + 1)  # the same validation batches every time
    losses = []
    for _ in range(cfg.eval_batches):
        x, y = batch(val_texts, rng)
        with autocast:
            losses.append(loss_fn(model(x), y).item())
    model.train()
    return float(np.mean(losses))


rng = random.Random(cfg.seed)
history = []
t0 = time.time()
tokens_seen = 0
bar = tqdm(range(cfg.steps), desc="train")
for step in bar:
    for g in opt.param_groups:
        g["lr"] = lr_at(step)
    x, y = batch(train_texts, rng)
    with autocast:
        loss = loss_fn(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    tokens_seen += x.numel()
    bar.set_postfix(loss=f"{loss.item():.3f}", tok_s=f"{tokens_seen / (time.time() - t0):.0f}")
    if (step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps:
        val = evaluate()
        history.append({"step": step + 1, "train_loss": loss.item(), "val_loss": val,
                        "minutes": (time.time() - t0) / 60})
        tqdm.write(f"step {step + 1}: train {loss.item():.3f}  val {val:.3f}")
        convert.save_checkpoint(out, mcfg, model.gguf_tensors(), tok.to_str(),
                                {"name": cfg.name, "fragment_rate": cfg.fragment_rate, "train": asdict(cfg),
                                 "history": history})

gguf = convert.from_checkpoint(out, args.gguf or out / "model.gguf")
(out / "history.json").write_text(json.dumps(history, indent=2))
print(f"wrote {gguf} ({gguf.stat().st_size / 1e6:.1f} MB) after {(time.time() - t0) / 60:.1f} min")
