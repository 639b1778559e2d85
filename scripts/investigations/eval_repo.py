"""Repository context on real weights: is the true next line more likely with T0+T1 before the file?

Each held-out repository (a git mirror, e.g. from the search tool's `fetch` into /work/.mirror) is
exported at one commit into a temporary directory (`git archive`; nothing is committed). Cursors are
line starts of Python files: the prompt holds the file from a line start at least --file-tokens tokens
before the line (the start is aligned to --align lines, so that the cursors of a file share their KV;
the same window in both conditions) and the scored target is the whole line. Conditions:

- file: the repository name and the file's header (path), then the file window;
- ctx:  the same with T0 (the project map, the same for every file as in the daemon; the scored file's
        own lines are left out of it when it is in the map, so that no line is scored from itself) and
        T1 (what the file uses from other files, computed on the file without the scored line, as the
        buffer is before the line is typed) in between, in the model's repository format (plain-text
        comments for models without repository tokens, e.g. gemma3-270m).

Two sets: "cross" (lines that refer to a name imported from another project file; import lines
excluded) and "all" (any non-blank line). Reported: bits per character of each condition and the paired
gain (file - ctx) with a 95% bootstrap CI over cursors.

    nice -n 19 python scripts/investigations/eval_repo.py --per-set 200                      # gemma, bits/char
    python scripts/investigations/eval_repo.py --per-set 1000 --shard 0/2 & ... --shard 1/2  # parallel, resumable
    python scripts/investigations/eval_repo.py --report                                      # merge the shards' results
    python scripts/investigations/eval_repo.py --mode em --model qwen2.5-coder-1.5b.gguf --name qwen  # FIM exact match
"""

import argparse
import hashlib
import json
import random
import re
import subprocess
import time
import zlib
from pathlib import Path

import numpy as np

from efim_local.bench import util as bu
from efim_local.bench.subtoken import bootstrap
from efim_local.config import ContextParams
from efim_local.llama import Batch, Context, Model
from efim_local.prompt.repo_format import render, repo_format, tokenize_segments
from efim_local.repo import RepoIndex, Tier, TierLimits, cross_file_names, file_context, project_map

REPOS = ["encode/starlette", "encode/httpx", "pallets/flask", "fastapi/typer"]
ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--repos", nargs="*", default=REPOS, help="owner/name (under --mirrors) or git directories")
ap.add_argument("--mirrors", default="/work/.mirror")
ap.add_argument("--commit", default="HEAD")
ap.add_argument("--per-set", type=int, default=200, help="cursors per set, split evenly over repositories")
ap.add_argument("--file-tokens", type=int, default=256, help="at least this many tokens of the file before the line")
ap.add_argument("--align", type=int, default=16, help="the window starts at a multiple of this many lines")
ap.add_argument("--suffix-tokens", type=int, default=64, help="tokens after the line (--mode em)")
ap.add_argument("--t0-chars", type=int, default=TierLimits.t0_chars)
ap.add_argument("--t1-chars", type=int, default=TierLimits.t1_chars)
ap.add_argument("--t1-first-lines", type=int, default=TierLimits.t1_first_lines)
ap.add_argument("--t1-snippet-chars", type=int, default=TierLimits.t1_snippet_chars)
ap.add_argument("--max-line", type=int, default=160)
ap.add_argument("--seed", type=int, default=0)
ap.add_argument("--shard", default="0/1", help="K/N: this process scores the files with hash % N == K")
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--mode", choices=("bpc", "em"), default="bpc")
ap.add_argument("--model", default="gemma", help="'gemma' or a GGUF path (--mode em: a FIM model)")
ap.add_argument("--name", default=None, help="results directory name (default: from --model and --mode)")
ap.add_argument("--t1-only", action=argparse.BooleanOptionalAction, default=False,
                help="also score T1 alone (no project map), a third condition")
ap.add_argument("--report", action="store_true", help="summarise the saved results, score nothing")
ap.add_argument("--hits", action="store_true", help="with --report: split the cross-file lines by whether T1 "
                "holds the definition of a name the line uses (T1 recomputed from the exported trees)")
args = ap.parse_args()
name = args.name or f"{'gemma' if args.model == 'gemma' else Path(args.model).stem}-{args.mode}"
out_dir = bu.RESULTS / f"repo-{name}"


# -- report -----------------------------------------------------------------------------------------------
def report() -> None:
    rows = {}
    for f in sorted(out_dir.glob("shard-*.jsonl")):
        for line in f.read_text().splitlines():
            r = json.loads(line)
            rows[r["id"]] = r
    if not rows:
        raise SystemExit(f"no results in {out_dir}")
    summary = []
    for set_name in ("cross", "all"):
        sel = [r for r in rows.values() if r[set_name]]
        if not sel:
            continue
        ch = np.array([r["chars"] for r in sel], dtype=float)
        row = {"set": set_name, "cursors": len(sel), "repos": len({r["repo"] for r in sel})}
        if args.mode == "bpc":
            bf, bc = (np.array([r[k] for r in sel]) for k in ("bits_file", "bits_ctx"))
            gain = bootstrap(bf - bc, ratio_of=ch, seed=args.seed, n=2000)
            row.update({"file bits/char": bf.sum() / ch.sum(), "ctx bits/char": bc.sum() / ch.sum(),
                        "gain": gain[0], "95% CI": f"{gain[1]:+.3f} to {gain[2]:+.3f}", "lo": gain[1], "hi": gain[2]})
            if all("bits_t1" in r for r in sel):  # T1 alone (no project map)
                b1 = np.array([r["bits_t1"] for r in sel])
                g1 = bootstrap(bf - b1, ratio_of=ch, seed=args.seed, n=2000)
                row.update({"T1-only bits/char": b1.sum() / ch.sum(), "T1-only gain": g1[0],
                            "T1 95% CI": f"{g1[1]:+.3f} to {g1[2]:+.3f}"})
        else:
            ef, ec = (np.array([r[k] for r in sel], dtype=float) for k in ("em_file", "em_ctx"))
            gain = bootstrap(100 * (ec - ef), seed=args.seed, n=2000)
            row.update({"file EM %": 100 * ef.mean(), "ctx EM %": 100 * ec.mean(), "gain pt": gain[0],
                        "95% CI": f"{gain[1]:+.1f} to {gain[2]:+.1f}", "lo": gain[1], "hi": gain[2]})
        summary.append(row)
    cols = [c for c in summary[0] if c not in ("lo", "hi")]
    print(bu.table(summary, cols))
    secs = sum(r.get("seconds", 0) for r in rows.values())
    ctx_tok = np.mean([r["ctx_tokens"] - r["file_tokens"] for r in rows.values()])
    print(f"{len(rows)} cursors; {secs / 60:.1f} min of scoring; repository context {ctx_tok:.0f} tokens on average")
    if args.hits and args.mode == "bpc":
        hits(rows)
    print("saved", bu.save(f"repo-{name}-summary", {"args": vars(args), "summary": summary, "cursors": len(rows)}))


def hits(rows: dict) -> None:
    """The cross-file lines' gain, split by whether T1 holds a definition the line refers to (its
    header line is in T1): how much a better choice of T1 could gain at most on this model."""
    from efim_local.repo.tiers import used_targets

    split: dict[bool, list] = {True: [], False: []}
    indexes: dict[str, RepoIndex] = {}
    for r in (r for r in rows.values() if r["cross"]):
        tree = Path("/tmp/efim-eval-repo") / f"{r['repo']}-{r['commit'][:12]}"
        if not tree.exists():
            raise SystemExit(f"{tree} is missing: run a scoring pass first (it exports the trees)")
        index = indexes.setdefault(r["repo"], RepoIndex.build(tree, r["repo"]))
        text = (tree / r["path"]).read_text("utf-8", errors="replace")
        lines = text.split("\n")
        line = lines[r["line"]]
        start = sum(len(x) + 1 for x in lines[:r["line"]])
        rest = (text[:start] + text[start + len(line) + 1:]).encode()
        t1 = "\n".join(p.text for p in file_context(index, r["path"], rest, limits_of(args)).pieces)
        on_line = used_targets(index, r["path"], line.encode() + b"\n" + rest)  # as the file uses them...
        on_line = {t for t in on_line if t.definition is not None and any(  # ...those the line names
            w == t.definition.name for w in WORD.findall(line))}
        heads = []  # each definition's header line (past its decorators): the one that names it
        for t in on_line:
            src = (index.root / t.path).read_text("utf-8", errors="replace").split("\n")
            d = t.definition
            heads += [ln.strip() for ln in src[d.line:d.line + max(1, d.sig_lines)] if d.name in ln][:1]
        split[any(h in t1 for h in heads)].append(r)
    out = []
    for held, sel in split.items():
        if sel:
            ch = np.array([r["chars"] for r in sel], dtype=float)
            g = bootstrap(np.array([r["bits_file"] - r["bits_ctx"] for r in sel]), ratio_of=ch, seed=args.seed, n=2000)
            out.append({"T1 holds a definition the line names": "yes" if held else "no", "cursors": len(sel),
                        "gain": f"{g[0]:.3f}", "95% CI": f"{g[1]:+.3f} to {g[2]:+.3f}"})
    print(bu.table(out, list(out[0])))


def limits_of(a) -> TierLimits:
    return TierLimits(t0_chars=a.t0_chars, t1_chars=a.t1_chars, t1_first_lines=a.t1_first_lines,
                      t1_snippet_chars=a.t1_snippet_chars)


WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
if args.report:
    report()
    raise SystemExit(0)


# -- repositories and cursors -------------------------------------------------------------------------------
def checkout(repo: str) -> tuple[str, Path, str]:
    """(name, exported tree, commit) of one repository at --commit."""
    git = Path(repo) if Path(repo).exists() else Path(args.mirrors) / repo.replace("/", "+") / "repo"
    sha = subprocess.run(["git", "--git-dir", str(git), "rev-parse", args.commit], capture_output=True, text=True,
                         check=True).stdout.strip()
    short = repo.rstrip("/").split("/")[-1] if not Path(repo).exists() else git.parent.name.split("+")[-1]
    dest = Path("/tmp/efim-eval-repo") / f"{short}-{sha[:12]}"
    if not dest.exists():
        tmp = dest.with_suffix(".tmp")
        subprocess.run(["rm", "-rf", str(tmp)], check=True)
        tmp.mkdir(parents=True)
        archive = subprocess.run(["git", "--git-dir", str(git), "archive", sha], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive.stdout, check=True)
        tmp.rename(dest)
    return short, dest, sha


rng = random.Random(args.seed)
repos, cursors = {}, []
k_shard, n_shard = (int(x) for x in args.shard.split("/"))
for repo in args.repos:
    short, tree, sha = checkout(repo)
    index = RepoIndex.build(tree, short)
    repos[short] = (index, sha)
    cross, every = [], []
    for rel in sorted(p for p in index.files if p.endswith(".py")):
        text = (tree / rel).read_text("utf-8", errors="replace")
        names = set(cross_file_names(index, rel, text.encode()))
        pos = 0
        for i, line in enumerate(text.split("\n")):
            start, pos = pos, pos + len(line) + 1
            if i == 0 or not line.strip() or len(line) > args.max_line or not line.isascii():
                continue
            c = (short, rel, i, start)
            every.append(c)
            s = line.strip()
            if not s.startswith(("import ", "from ")) and names & set(WORD.findall(s)):
                cross.append(c)
    n = args.per_set // len(args.repos)
    picked = {c: {"cross": False, "all": False} for c in []}
    for set_name, pool in (("cross", cross), ("all", every)):
        for c in rng.sample(pool, min(n, len(pool))):
            picked.setdefault(c, {"cross": False, "all": False})[set_name] = True
    print(f"{short} {sha[:12]}: {len(index.files)} files, {len(every)} lines, {len(cross)} cross-file lines")
    cursors += [(c, flags) for c, flags in picked.items()]
# Repositories in turn (their T0 is the shared head of every prompt), files in a pseudo-random order
# within each (lines in order within a file: its prompts share their KV).
order = {short: k for k, short in enumerate(repos)}
cursors.sort(key=lambda cf: (order[cf[0][0]], zlib.crc32(f"{cf[0][0]}/{cf[0][1]}".encode()), cf[0][2]))
cursors = [cf for cf in cursors if zlib.crc32(f"{cf[0][0]}/{cf[0][1]}".encode()) % n_shard == k_shard]
out_dir.mkdir(parents=True, exist_ok=True)
out_file = out_dir / f"shard-{k_shard}-of-{n_shard}.jsonl"
done = set()
for f in out_dir.glob("shard-*.jsonl"):
    done |= {json.loads(line)["id"] for line in f.read_text().splitlines()}
todo = [cf for cf in cursors if f"{cf[0][0]}:{cf[0][1]}:{cf[0][2]}" not in done]
print(f"shard {args.shard}: {len(cursors)} cursors, {len(cursors) - len(todo)} already scored")

# -- the model ----------------------------------------------------------------------------------------------
path = bu.gemma_path() if args.model == "gemma" else Path(args.model)
model = Model(path)
N_CTX = 4096
ctx = Context(model, ContextParams(n_ctx_seq=N_CTX, n_slots=3, n_batch=512, n_threads=args.threads,
                                   n_threads_batch=args.threads))
template = None
if args.mode == "em":
    from efim_local.config import Config
    from efim_local.engine.engine import make_planner  # scripts sit above every layer

    template, _ = make_planner(model, Config(model=str(path)))
fmt = repo_format(template, model)
BOS = tuple(model.bos)
print(f"model {path.name}: repository format {fmt.name}")


class Seq:
    """One KV sequence that keeps what it holds, so consecutive prompts share their common prefix."""

    def __init__(self, seq: int):
        self.seq, self.held = seq, []

    def feed(self, tokens: list[int], want_from: int) -> list[np.ndarray]:
        """Decode ``tokens`` (reusing the common prefix); logits of positions >= ``want_from``."""
        n = 0
        while n < min(len(self.held), len(tokens), want_from) and self.held[n] == tokens[n]:
            n += 1
        ctx.seq_rm(self.seq, n, -1)
        self.held = self.held[:n]
        rows = []
        batch = Batch(512, 1)
        for start in range(n, len(tokens), 512):
            batch.clear()
            idx = [batch.add(t, p, self.seq, logits=p >= want_from)
                   for p, t in enumerate(tokens[start:start + 512], start)]
            ctx.decode(batch)
            rows += [ctx.logits(i) for i, p in zip(idx, range(start, len(tokens))) if p >= want_from]
        self.held = list(tokens)
        return rows

    def bits(self, prompt: list[int], target: list[int]) -> float:
        rows = self.feed(prompt + target[:-1], len(prompt) - 1)
        total = 0.0
        for row, t in zip(rows, target):
            m = row.max()
            total += float(m + np.log(np.exp(row - m).sum()) - row[t])
        return total / np.log(2)

    def greedy(self, prompt: list[int], max_new: int = 48) -> str:
        toks, out = list(prompt), b""
        for _ in range(max_new):
            row = self.feed(toks, len(toks) - 1)[-1]
            t = int(np.argmax(row))
            if model.is_eog(t) or t in template.stop_tokens:
                break
            out += model.piece(t)
            toks.append(t)
            if b"\n" in out:
                break
        return out.split(b"\n")[0].decode("utf-8", "replace")


def window(text: str, lines: list[str], i: int, n: int, tail: bool) -> tuple[str, list[int]]:
    """The file before line ``i`` from an aligned line start at least ``n`` tokens back (tail), or at
    most ``n`` tokens of ``text``'s start; and the text they were cut from."""
    if not tail:
        piece = text[:8 * n]
        toks = model.tokenize(piece)
        return piece, (toks[:-1] if len(piece) < len(text) else toks)[:n]
    first, count = i, 0
    while first > 0 and count < n:  # per-line counts: an estimate of where the window must start
        first -= 1
        count += len(model.tokenize(lines[first] + "\n"))
    first -= first % args.align
    piece = "".join(line + "\n" for line in lines[first:i])
    return piece, model.tokenize(piece)


def t0_for(short: str, rel: str) -> Tier:
    """The repository's T0; without ``rel``'s lines when ``rel`` is in the map (cached per file)."""
    key = (short, "")
    if key not in t0_cache:
        t0_cache[key] = project_map(repos[short][0], limits)
    if rel in {p.path for p in t0_cache[key].pieces}:
        if (short, rel) not in t0_cache:
            t0_cache[(short, rel)] = project_map(repos[short][0], limits, exclude=rel)
        return t0_cache[(short, rel)]
    return t0_cache[key]


seqs = (Seq(0), Seq(1), Seq(2))
t0_cache: dict = {}
limits = limits_of(args)
t_start = time.perf_counter()
with out_file.open("a") as out:
    for k, ((short, rel, i, start), flags) in enumerate(todo):
        t_cursor = time.perf_counter()
        index, sha = repos[short]
        text = (index.root / rel).read_text("utf-8", errors="replace")
        eol = text.find("\n", start)
        eol = len(text) if eol < 0 else eol
        line = text[start:eol]
        t0 = t0_for(short, rel)
        t1 = file_context(index, rel, (text[:start] + text[eol + 1:]).encode(), limits)
        heads = {"file": render(fmt, short, [], rel), "ctx": render(fmt, short, [t0.pieces, t1.pieces], rel),
                 "t1": render(fmt, short, [t1.pieces], rel)}
        heads = {c: list(BOS) + tokenize_segments(s, model) for c, s in heads.items()}
        piece, prefix = window(text, text.split("\n"), i, args.file_tokens, tail=True)
        rec = {"id": f"{short}:{rel}:{i}", "repo": short, "commit": sha, "path": rel, "line": i, **flags,
               "chars": len(line), "t0_chars": t0.chars, "t1_chars": t1.chars,
               "ctx_tokens": len(heads["ctx"]) + len(prefix), "file_tokens": len(heads["file"]) + len(prefix)}
        if args.mode == "bpc":
            raw = model.tokenize(piece)
            full = model.tokenize(piece + line)
            if full[:len(raw)] != raw or len(full) == len(raw) or rec["ctx_tokens"] + len(full) > N_CTX:
                continue  # the line's first token would merge with the prefix's last: not scored
            target = full[len(raw):]
            rec["bits_file"] = seqs[0].bits(heads["file"] + prefix, target)
            rec["bits_ctx"] = seqs[1].bits(heads["ctx"] + prefix, target)
            if args.t1_only:
                rec["bits_t1"] = seqs[2].bits(heads["t1"] + prefix, target)
        else:
            m = template.markers
            _, suffix = window(text[eol:], [], 0, args.suffix_tokens, tail=False)
            for cond, seq in (("file", seqs[0]), ("ctx", seqs[1])):
                body = (list(m.pre) + prefix + list(m.suf) + suffix if m.order == "psm"
                        else list(m.suf) + suffix + list(m.pre) + prefix) + list(m.mid)
                rec[f"em_{cond}"] = seq.greedy(heads[cond] + body).rstrip() == line.rstrip()
        rec["seconds"] = time.perf_counter() - t_cursor
        rec["t1_digest"] = hashlib.sha256(t1.digest.encode()).hexdigest()[:12]
        out.write(json.dumps(rec) + "\n")
        out.flush()
        if k % 20 == 0:
            print(f"{k + 1}/{len(todo)} cursors, {(time.perf_counter() - t_start) / 60:.1f} min", flush=True)
print(f"scored {len(todo)} cursors in {(time.perf_counter() - t_start) / 60:.1f} min; --report to summarise")
report()
