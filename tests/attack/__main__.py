"""Attack a running efim daemon (and efim lsp) with every bad-client behaviour of issues 17 and 27.

Runs the attacks of tests/attack/ (surrogates, NaN, connection flood, slow reader,
slow writer, FIFO and /dev/zero documents, a huge didChange, the UTF-8 limit, idle tokenizing,
many roots, the engine watchdog, --socket at a file, a planted daemon.pid link; and from issue 27:
edits the daemon refuses behind efim lsp, a 10 MB efim.accepted, Content-Length 10^23, frames
without Content-Length, short or LF-only, an oversized frame's id, / and ~ as roots, the socket's
lock file, efim lsp when the daemon cannot start, a planted store directory, the index's mode;
and on `efim models`, a FIFO or /dev/zero as EFIM_KNOWN_MODELS and catalog entries with '..')
against the daemon on the socket, then prints a table, saves bench-results/attack.json and exits 1
if any attack got through. The daemon's deadlines default to the production ones (10 s each).

    efim daemon start && python -m tests.attack        # from the checkout's root
    python -m tests.attack --socket /tmp/t/efim.sock --only flood slow_reader
"""

import argparse
import json
import sys
from pathlib import Path

from efim_local.daemon import paths
from tests.attack import ATTACKS, Target, run

ap = argparse.ArgumentParser(prog="python -m tests.attack", description=__doc__,
                             formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--socket", type=Path, default=None, help="the daemon's socket (default: efim's)")
ap.add_argument("--only", nargs="+", choices=list(ATTACKS), help="run only these attacks")
ap.add_argument("--frame-timeout", type=float, default=10.0, help="the daemon's per-frame read deadline (s)")
ap.add_argument("--send-timeout", type=float, default=10.0, help="the daemon's send deadline (s)")
args = ap.parse_args()

target = Target(args.socket or paths.socket_path(), args.frame_timeout, args.send_timeout)
rows = run(target, args.only)
mark = {True: "held", False: "FAILED", None: "skipped"}
print(f"{'attack':18} {'result':8} {'s':>6}  detail")
for r in rows:
    print(f"{r['attack']:18} {mark[r['held']]:8} {r['seconds']:6.1f}  {r['detail']}")
failed = sum(r["held"] is False for r in rows)
print(f"\n{sum(r['held'] is True for r in rows)} held, {failed} failed, {sum(r['held'] is None for r in rows)} skipped")
out = Path("bench-results")
out.mkdir(exist_ok=True)
(out / "attack.json").write_text(json.dumps(rows, indent=1))
sys.exit(1 if failed else 0)
