"""Build an edit trace that `efim bench` replays, from real changes of a project.

From git history (by default this repository's own history of a few core modules, written to
efim_local/data/edit-trace.json.gz, the `efim` trace), or from a project's published source
releases on PyPI, each release's change to each file being one "commit" (the `click` trace:
efim_local/data/click-trace.json.gz, shipped with click's BSD-3-Clause notice beside it).

    python scripts/make_trace.py
    python scripts/make_trace.py --repo ~/src/project --files src/app.py --out /tmp/trace.json.gz
    python scripts/make_trace.py --pypi click --versions 8.1.0 8.1.1 8.1.2 8.1.3 8.1.4 8.1.5 8.1.6 8.1.7 8.1.8 \\
        --files src/click/decorators.py src/click/shell_completion.py src/click/_compat.py \\
            src/click/_termui_impl.py src/click/utils.py src/click/types.py src/click/parser.py \\
            src/click/testing.py src/click/termui.py src/click/exceptions.py \\
        --min-bytes 12000 --max-bytes 40000 --min-typed 40 --max-typed 3000 --out efim_local/data/click-trace.json.gz
"""

import argparse
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from efim_local.bench import trace

ROOT = Path(__file__).resolve().parent.parent
ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--repo", type=Path, default=ROOT)
ap.add_argument("--pypi", metavar="NAME", help="build from these source releases of a PyPI project instead of git")
ap.add_argument("--versions", nargs="+", default=[], help="with --pypi: the releases, oldest first")
# The shipped trace's modules, by the paths they had before the package was split into layers.
ap.add_argument("--files", nargs="+", default=["efim_local/engine.py", "efim_local/planner.py",
                                               "efim_local/store/store.py", "efim_local/daemon/server.py"])
ap.add_argument("--min-bytes", type=int, default=4000)
ap.add_argument("--max-bytes", type=int, default=10**9)
ap.add_argument("--min-typed", type=int, default=200)
ap.add_argument("--max-typed", type=int, default=8000)
ap.add_argument("--out", type=Path, default=trace.DEFAULT_TRACE)
args = ap.parse_args()
limits = trace.Limits(args.min_bytes, args.max_bytes, args.min_typed, args.max_typed)


def sdists(name: str, versions: list[str], tmp: Path) -> list[tuple[str, Path]]:
    """Each release's source archive from PyPI (pip's own client), unpacked."""
    out = []
    for v in versions:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                        f"{name}=={v}", "-d", str(tmp)], check=True)
        sdist = next(p for p in tmp.glob("*.tar.gz") if p.name.lower().startswith(f"{name.lower()}-{v}.tar"))
        with tarfile.open(sdist) as tf:
            tf.extractall(tmp, filter="data")
        out.append((v, next(tmp.glob(f"[{name[0].lower()}{name[0].upper()}]{name[1:]}-{v}"))))
    return out


with tempfile.TemporaryDirectory() as tmp:
    if args.pypi:
        commits = trace.from_releases(sdists(args.pypi, args.versions, Path(tmp)), args.files, limits)
        source = f"PyPI source releases of {args.pypi} {args.versions[0]} to {args.versions[-1]}"
    else:
        commits = trace.from_git(args.repo, args.files, limits)
        source = f"git history of {args.repo.name}"
for c in commits:
    n = sum(1 for _ in trace.requests(c))
    print(f"{c.sha:14} {c.file:34} {len(c.before):6} bytes  {n:4} requests  {c.subject[:50]}")
trace.save(commits, args.out, source=f"{source}: {', '.join(args.files)}")
print(f"saved {len(commits)} commits to {args.out} ({args.out.stat().st_size} bytes)")
