"""Write random-weight GGUFs with the exact shapes of Qwen2.5-Coder-0.5B, -1.5B and -3B (Q8_0).

Their text is noise; their timings are real (see efim_local/training/shape_models.py).
Benchmarks use them: `efim bench speed --models DIR`, or `efim bench paced --model PATH` (any part).

    .venv/bin/python scripts/make_shape_models.py                 # all three, into models/
    .venv/bin/python scripts/make_shape_models.py --only qwen2.5-coder-0.5b --out /tmp/m
"""

import argparse
import time
from pathlib import Path

from tqdm import tqdm

from efim_local.training import shape_models as sm

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--out", type=Path, default=Path("models"))
ap.add_argument("--only", choices=sorted(sm.SHAPES), action="append")
ap.add_argument("--seed", type=int, default=0)
args = ap.parse_args()

args.out.mkdir(parents=True, exist_ok=True)
for name in args.only or sorted(sm.SHAPES):
    shape = sm.SHAPES[name]
    path = args.out / f"{name}-random-q8_0.gguf"
    t0 = time.perf_counter()
    with tqdm(total=len(sm.tensor_shapes(shape)), desc=name, unit="tensor") as bar:
        sm.build(path, shape, seed=args.seed, progress=bar.update)
    print(f"{path}: {sm.n_params(shape) / 1e6:.0f}M parameters, {path.stat().st_size / 1e6:.0f} MB, "
          f"{time.perf_counter() - t0:.0f} s")
