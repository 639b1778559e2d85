"""Attack a running efim daemon with every bad-client behaviour of issue 17; print what held.

Runs the attacks of efim_local/bench/attack.py (surrogates, NaN, connection flood, slow reader,
slow writer, FIFO and /dev/zero documents, a huge didChange, the UTF-8 limit, idle tokenizing,
many roots, the engine watchdog, --socket at a file, a planted daemon.pid link) against the
daemon on the socket, and those of efim_local/bench/attack_cli.py on `efim models` (a FIFO or
/dev/zero as EFIM_KNOWN_MODELS, catalog entries with '..'), then prints a table, saves
bench-results/attack.json and exits 1 if any attack got through. The daemon's deadlines default to
the production ones (10 s each).

    efim daemon start && python scripts/attack.py
    python scripts/attack.py --socket /tmp/t/efim.sock --only flood slow_reader
"""

import argparse
import json
import sys
from pathlib import Path

from efim_local.bench.attack import ATTACKS, Target, run
from efim_local.bench.attack_cli import CLI_ATTACKS
from efim_local.daemon import paths

ATTACKS.update(CLI_ATTACKS)  # the command line's inputs too (EFIM_KNOWN_MODELS)
ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--socket", type=Path, default=None, help="the daemon's socket (default: efim's)")
ap.add_argument("--only", nargs="+", choices=list(ATTACKS), help="run only these attacks")
ap.add_argument("--frame-timeout", type=float, default=10.0, help="the daemon's per-frame read deadline (s)")
ap.add_argument("--send-timeout", type=float, default=10.0, help="the daemon's send deadline (s)")
args = ap.parse_args()

target = Target(args.socket or paths.socket_path(), args.frame_timeout, args.send_timeout)
rows = run(target, args.only)
mark = {True: "held", False: "FAILED", None: "skipped"}
print(f"{'attack':15} {'result':8} {'s':>6}  detail")
for r in rows:
    print(f"{r['attack']:15} {mark[r['held']]:8} {r['seconds']:6.1f}  {r['detail']}")
failed = sum(r["held"] is False for r in rows)
print(f"\n{sum(r['held'] is True for r in rows)} held, {failed} failed, {sum(r['held'] is None for r in rows)} skipped")
out = Path("bench-results")
out.mkdir(exist_ok=True)
(out / "attack.json").write_text(json.dumps(rows, indent=1))
sys.exit(1 if failed else 0)
