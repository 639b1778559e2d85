"""Calibrate InfiniGen's skewing matrices for a model (once per model).

Runs standard-library test code through llama.cpp, captures every layer's post-RoPE Q and K
(eval callback), and writes the partial projections to a sidecar named by the model fingerprint
in ~/.cache/efim/infinigen/.

    python scripts/calibrate_infinigen.py --model default
    python scripts/calibrate_infinigen.py --model gemma --tokens 4096
"""

import argparse
import time
from pathlib import Path

from efim_local.bench import util as bu
from efim_local.kv.sparse import skew
from efim_local.training import corpus
from efim_local.kv.fingerprint import model_fingerprint

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--model", default="default", help="'default', 'gemma' or a GGUF path")
ap.add_argument("--tokens", type=int, default=2048, help="calibration tokens")
ap.add_argument("--ratio", type=float, default=0.2, help="partial dimensions kept (InfiniGen: 0.2)")
ap.add_argument("--out", type=Path, default=None, help="directory (default: ~/.cache/efim/infinigen)")
args = ap.parse_args()

model, _ = bu.bench_model(args.model)
fp = model_fingerprint(model).hex()
t0 = time.perf_counter()
s = skew.calibrate(model, corpus.calibration_text(), fp, args.tokens, args.ratio)
path = skew.sidecar_path(args.out or skew.default_dir(), fp)
s.save(path)
print(f"{model.name}: {s.proj.shape[0]} layers, {s.n_head} heads / {s.n_kv} KV heads, head_dim {s.head_dim}, "
      f"r={s.r}; state layers per section: {[s.layers_of(i) for i in range(len(s.section_layers))]}")
print(f"saved {path} in {time.perf_counter() - t0:.1f} s")
