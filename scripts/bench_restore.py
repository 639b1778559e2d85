"""Restoring saved KV states vs re-prefilling them (see efim_local/bench/restore.py).

For prompts of 1k, 4k and 8k tokens, on gemma3-270m and on the default model: time to first token
from nothing, the RAM tier, the disk tier, and after a restart.

    python scripts/bench_restore.py                   # both models
    python scripts/bench_restore.py --models default  # quick
"""

import argparse

from efim_local.bench import util as bu
from efim_local.bench import restore

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--models", default="gemma,default")
ap.add_argument("--sizes", default="1024,4096,8192")
ap.add_argument("--repeat", type=int, default=3, help="restores per tier (the median is reported)")
args = ap.parse_args()

rows = []
for name in args.models.split(","):
    model, template = bu.bench_model(name)
    rows += restore.run(name, model, template, [int(s) for s in args.sizes.split(",")], args.repeat)
print(bu.table(rows, list(rows[0])))
path = bu.save("restore-" + args.models.replace(",", "-"), {"args": vars(args), "rows": rows})
print(f"saved {path}")
