"""How fast this machine prefills with this model, learned online.

Prefilling ``n`` new tokens after ``c`` tokens already in the slot costs about
``n * (a + b * (c + n / 2))`` ms: a per-token cost for the weights, plus
attention over the context so far. ``a`` and ``b`` are fitted by least
squares over recent prefills (older ones fade), so the model follows the
machine's load. The latency budget asks it how many new tokens fit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .policy import Policy


@dataclass
class PrefillSpeed:
    a: float = 0.0  # ms per new token
    b: float = 0.0  # ms per new token per token of context
    n: int = 0  # observations so far
    learn: bool = True  # False: a fixed speed, observations are ignored
    # Decayed sums of the normal equations for y = a * x1 + b * x2.
    s11: float = 0.0
    s12: float = 0.0
    s22: float = 0.0
    s1y: float = 0.0
    s2y: float = 0.0
    policy: Policy = field(default_factory=Policy, repr=False, compare=False)  # its decay, the least it learns from

    @classmethod
    def fixed(cls, a: float, b: float = 0.0) -> "PrefillSpeed":
        """A known, fixed speed (tests, or a speed measured elsewhere)."""
        return cls(a=a, b=b, n=1, learn=False)

    @property
    def known(self) -> bool:
        return self.n > 0 and self.a > 0

    def observe(self, n_new: int, n_ctx: int, ms: float) -> None:
        """Record a prefill of ``n_new`` tokens after ``n_ctx`` cached ones that took ``ms``."""
        if not self.learn or n_new < self.policy.speed_min_tokens or not math.isfinite(ms) or ms <= 0:
            return
        x1, x2 = float(n_new), n_new * (n_ctx + n_new / 2)
        d = self.policy.speed_decay
        self.s11, self.s12, self.s22 = d * self.s11 + x1 * x1, d * self.s12 + x1 * x2, d * self.s22 + x2 * x2
        self.s1y, self.s2y = d * self.s1y + x1 * ms, d * self.s2y + x2 * ms
        self.n += 1
        det = self.s11 * self.s22 - self.s12 * self.s12
        a = b = None
        if det > 1e-9 * self.s11 * self.s22:
            a = (self.s1y * self.s22 - self.s2y * self.s12) / det
            b = (self.s11 * self.s2y - self.s12 * self.s1y) / det
        if a is None or a <= 0 or b < 0:  # too little spread in context sizes: per-token cost only
            a, b = self.s1y / self.s11, 0.0
        self.a, self.b = a, b

    def predict_ms(self, n_new: int, n_ctx: int) -> float:
        return n_new * (self.a + self.b * (n_ctx + n_new / 2))

    def max_new(self, budget_ms: float, n_ctx: int = 0) -> int:
        """The most new tokens whose prefill fits ``budget_ms`` after ``n_ctx`` cached ones."""
        if not self.known:
            return 1 << 30
        # Solve (b/2) n^2 + (a + b c) n - budget = 0 for n.
        p, q = self.b / 2, self.a + self.b * n_ctx
        n = budget_ms / q if p == 0 else (-q + math.sqrt(q * q + 4 * p * budget_ms)) / (2 * p)
        return max(0, int(n))


# -- persistence: the speed learned on this machine with this model serves the next start -------------
SPEED_FILE_MAX = 4096  # bytes
FIELDS = ("a", "b", "s11", "s12", "s22", "s1y", "s2y")


def speed_key(model_path, context, llama_version: str) -> str:
    """What the speed depends on: the model file, this machine's CPUs, the KV layout, llama.cpp."""
    import hashlib
    import json
    import os

    st = os.stat(model_path)
    try:
        cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo", encoding="utf-8", errors="replace")
                    if ln.startswith("model name")), "")
    except OSError:
        cpu = ""
    key = {"model": str(os.path.realpath(model_path)), "size": st.st_size, "mtime_ns": st.st_mtime_ns, "cpu": cpu,
           "cpus": len(os.sched_getaffinity(0)), "llama": llama_version, "type_k": context.type_k,
           "type_v": context.type_v, "flash_attn": context.flash_attn, "n_batch": context.n_batch}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]


def speed_path(store_dir, model_path, context):
    """Where the speed learned with this model, machine and KV layout is saved: beside the states."""
    from pathlib import Path

    import llama_cpp

    return Path(store_dir) / f"speed-{speed_key(model_path, context, llama_cpp.__version__)}.json"


def load_speed(path, policy: Policy | None = None) -> PrefillSpeed | None:
    """The speed saved at ``path`` (learning on by ``policy``); None if there is none or it is not a sane
    one (then it is ignored)."""
    import json

    from ..kv.stateformat import open_regular

    try:
        with open_regular(path, SPEED_FILE_MAX) as f:
            d = json.loads(f.read(SPEED_FILE_MAX + 1))
        vals = {k: float(d[k]) for k in FIELDS}
        n = int(d["n"])
    except Exception:  # noqa: BLE001 - missing, corrupt or foreign: learned afresh
        return None
    if not (0 < n < 1 << 40 and all(math.isfinite(v) and 0 <= abs(v) < 1e30 for v in vals.values())
            and 0 < vals["a"] < 1e6 and 0 <= vals["b"] < 1e3):
        return None
    return PrefillSpeed(n=n, **vals, policy=Policy() if policy is None else policy)


def save_speed(speed: PrefillSpeed, path) -> None:
    """Write ``speed`` to ``path`` (atomic, owner-only, never through a link)."""
    import json

    from ..kv.stateformat import write_private

    if not speed.known or not speed.learn:
        return
    d = {k: getattr(speed, k) for k in FIELDS} | {"n": speed.n}
    write_private(path, json.dumps(d).encode())
