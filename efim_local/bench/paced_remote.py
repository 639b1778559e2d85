"""The paced replay (``paced.py``) through efim with a remote backend, against efim in-process.

The same trace, pacing and requests twice: once through a daemon with the model in-process, once
through a daemon that plans locally (the vocabulary only) and sends its token plans to llama-server
replicas (``--backend``): started here on the same machine (``replicas``, each with a slot-save
directory), or already running (``urls``). With ``kill``, the replica that serves the file being
edited is killed halfway through the replay: the other one takes over, and a request that got an
error instead of an answer counts as lost (the goal: none).

Reported per run: the paced summary (time to first token as the editor sees it), the remote/local
p50 and p95 ratios, lost requests, and the daemon's backend status (served, failed, cache misses).
"""

from __future__ import annotations

import tempfile
import threading
import time

from . import util as bu
from .editors import EfimEditor
from .paced import PacedConfig, full_tokens, replay, requests, steps, summarize


class CountingEditor(EfimEditor):
    """An efim editor that keeps every outcome and the errors its requests got."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.outcomes, self.errors = [], []

    def fire(self, req, out) -> None:
        self.outcomes.append(out)
        try:
            super().fire(req, out)
        except Exception as e:  # noqa: BLE001 - an error answer is what this counts
            self.errors.append(f"{type(e).__name__}: {e}")

    def lost(self) -> int:
        """Requests neither answered nor cancelled (the user typed on)."""
        return sum(1 for o in self.outcomes if o.t_done is None and not o.cancelled)


def _efim(cfg: PacedConfig, st, fired, *extra: str, during=None) -> tuple[list[dict], CountingEditor, dict]:
    """One paced replay through a fresh daemon (``extra``: its arguments); ``during(editor)`` runs
    beside the replay (a thread), for what happens to the backends meanwhile."""
    conf = {"max_tokens": cfg.max_tokens}
    if cfg.max_prompt_ms is not None:
        conf["max_prompt_ms"] = cfg.max_prompt_ms
    proc, sock = bu.spawn_daemon(cfg.model, None, "--layout", "efim", "--n-ctx", str(cfg.n_ctx), *extra, config=conf)
    time.sleep(2.0)  # the daemon calibrates when idle after start
    ed = CountingEditor(sock, cfg.max_tokens)
    try:
        side = threading.Thread(target=during, args=(ed,), daemon=True) if during else None
        if side is not None:
            side.start()
        rows = replay(ed, st, fired, desc="efim-remote" if "--backend" in extra else "efim")
        if side is not None:
            side.join(60)
        status = ed.ctl.call("status")
    finally:
        ed.close()
        proc.terminate()
        proc.wait(30)
    return rows, ed, status


def run(cfg: PacedConfig, urls: list[str] | None = None, replicas: int = 2, kill: bool = False,
        slots: int = 2) -> dict:
    """The paced replay in-process, then through replicas (started here unless ``urls``); ``kill``
    one replica halfway (only replicas started here)."""
    from . import trace as tr
    from ..backend.pool import Ring
    from ..engine.remote_steps import session_key
    from .peers import LlamaServer

    st = steps(tr.load(tr.resolve(cfg.trace)), cfg.pacing)
    fired = requests(st, cfg.pacing, cfg.max_requests)
    st = st[:fired[-1].step + 2] if fired else st
    full = full_tokens(cfg.model, fired, cfg.n_ctx)
    rows, out = {}, {"lost": {}, "errors": {}, "backend": None, "killed": None}
    local_rows, local_ed, _ = _efim(cfg, st, fired, "--threads", str(cfg.threads))
    rows["efim"], out["lost"]["efim"] = local_rows, local_ed.lost()
    servers, saves = [], []
    try:
        if urls is None:
            for _ in range(replicas):
                saves.append(tempfile.TemporaryDirectory(prefix="efim-slots-"))
                servers.append(LlamaServer(cfg.server, cfg.model, cfg.n_ctx, cfg.threads, parallel=slots,
                                           extra=("--slot-save-path", saves[-1].name + "/")))
            urls = [s.url for s in servers]

        def killer(ed: CountingEditor) -> None:
            """Halfway, kill the replica that serves the file being edited (its requests fail over)."""
            time.sleep(fired[len(fired) // 2].t if fired else 0)
            path = fired[min(len(fired) - 1, len(fired) // 2)].path
            victim = servers[Ring(urls).order(session_key(path))[0]]
            victim.kill()
            out["killed"] = {"url": victim.url, "at_s": round(fired[len(fired) // 2].t, 1), "file": path}

        name = "efim-remote" + ("-killed" if kill and servers else "")
        r, ed, status = _efim(cfg, st, fired, "--backend", ",".join(urls),
                              during=killer if kill and servers else None)
        rows[name], out["lost"][name], out["errors"][name] = r, ed.lost(), ed.errors[:5]
        out["backend"] = status.get("backend")
    finally:
        for s in servers:
            s.close()
        for d in saves:
            d.cleanup()
    summary = [summarize(name, r, full) for name, r in rows.items()]
    base = summary[0]
    for s in summary:
        s["lost"] = out["lost"][s["backend"]]
        for q in ("p50", "p95"):
            s[f"ttft_{q}_vs_inprocess"] = s[f"ttft_{q}_ms"] / base[f"ttft_{q}_ms"]
    return {"trace": str(cfg.trace or "efim"), "requests": len(fired), "replicas": len(urls),
            "keystrokes": sum(s.kind in ("key", "over") for s in st),
            "auto_pair_keys": sum(s.kind == "over" for s in st),
            "duration_s": st[-1].t if st else 0, "busy": False, "max_prompt_ms": cfg.max_prompt_ms,
            "notes": [f"replica {out['killed']['url']} killed at {out['killed']['at_s']} s"] if out["killed"] else [],
            "summary": summary, "rows": rows, **out}


def run_spec(cfg: PacedConfig, backend: str, kill: bool = False) -> dict:
    """``run`` for ``efim bench paced --backend``: "local:N" starts N replicas here, else URLs."""
    if backend.startswith("local:"):
        return run(cfg, None, int(backend[6:] or 2), kill)
    return run(cfg, [u.strip() for u in backend.split(",") if u.strip()])

