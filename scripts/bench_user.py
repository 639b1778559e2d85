"""A simulated user in the paced replay (efim_local/bench/user.py), with gemma3-270m: accepts,
type-through keystrokes and the time to the next suggestion after an accept.

    nice -n 19 python scripts/bench_user.py --requests 80            # the click trace, real pace
    nice -n 19 python scripts/bench_user.py --requests 60 --patient 20   # the user waits for each suggestion
    python scripts/bench_user.py --trace efim --requests 40 --out user.json
"""

import argparse
import json
import os

from efim_local.bench import paced
from efim_local.bench import trace as tr
from efim_local.bench.suite import bench_model
from efim_local.bench.user import run_user


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="gemma")
    ap.add_argument("--trace", default="click")
    ap.add_argument("--requests", type=int, default=100)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-prompt-ms", type=float, default=None, help="latency budget (default: the config's)")
    ap.add_argument("--patient", type=float, default=0.0,
                    help="wait up to this many seconds for each suggestion (a loaded machine); 0: real pace")
    ap.add_argument("--out", type=str, default=None, help="write the report (JSON) here")
    a = ap.parse_args()
    model, _ = bench_model(a.model)
    cfg = paced.PacedConfig(model, max_requests=a.requests, max_tokens=a.max_tokens, threads=a.threads,
                            trace=a.trace, n_ctx=4096, max_prompt_ms=a.max_prompt_ms)
    res = run_user(cfg, paced.steps(tr.load(tr.resolve(a.trace)), cfg.pacing), a.patient)
    res["load_avg"] = os.getloadavg()
    print(json.dumps({k: v for k, v in res.items() if k != "accepts_detail"}, indent=2))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
