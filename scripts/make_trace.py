"""Build the edit trace that `efim bench` replays, from real commits of a git repository.

By default: this repository's own history of a few core modules, written to
efim_local/data/edit-trace.json.gz (shipped, so the benchmark needs no git history).

    python scripts/make_trace.py
    python scripts/make_trace.py --repo ~/src/project --files src/app.py --out /tmp/trace.json.gz
"""

import argparse
from pathlib import Path

from efim_local.bench import trace

ROOT = Path(__file__).resolve().parent.parent
ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--repo", type=Path, default=ROOT)
# The shipped trace's modules, by the paths they had before the package was split into layers.
ap.add_argument("--files", nargs="+", default=["efim_local/engine.py", "efim_local/planner.py",
                                               "efim_local/store/store.py", "efim_local/daemon/server.py"])
ap.add_argument("--out", type=Path, default=trace.DEFAULT_TRACE)
args = ap.parse_args()

commits = trace.from_git(args.repo, args.files)
for c in commits:
    n = sum(1 for _ in trace.requests(c))
    print(f"{c.sha} {c.file:30} {len(c.before):6} bytes  {n:4} requests  {c.subject[:50]}")
trace.save(commits, args.out, source=f"git history of {args.repo.name}: {', '.join(args.files)}")
print(f"saved {len(commits)} commits to {args.out} ({args.out.stat().st_size} bytes)")
