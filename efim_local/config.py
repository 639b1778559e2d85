"""Configuration: dataclasses, a TOML file, environment variables.

Every value is checked when a Config is built (``__post_init__``), so a wrong type, a negative or
NaN budget or an unknown key is one line and exit 2 at load time, never a traceback after an
answer. Booleans must be TOML booleans: ``store = "no"`` is an error, not a truthy string.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from urllib.parse import urlsplit

from .errors import ConfigError, InvalidParams
from .request import Options, check

KV_TYPES = {"f32": 0, "f16": 1, "q8_0": 8, "q4_0": 2, "bf16": 30}  # names → ggml_type


def _rule(kind: type, lo: float | None = None, hi: float | None = None, choices=None) -> dict:
    return {"kind": kind, "lo": lo, "hi": hi, "choices": choices}


# What each setting may hold, checked by the request's own checker (efim_local/request.py ``check``).
# The settings that are a request's defaults take the request's definition.
REQUEST_DEFAULTS = ("max_tokens", "layout", "max_prompt_ms", "heal")
RULES = {name: Options.rule(name) for name in REQUEST_DEFAULTS} | {
    "n_ctx_seq": _rule(int, 64, 1 << 20), "n_slots": _rule(int, 1, 256), "n_batch": _rule(int, 1, 1 << 16),
    "n_threads": _rule(int, 0, 1024), "n_threads_batch": _rule(int, 0, 1024),
    "type_k": _rule(str, choices=tuple(KV_TYPES)), "type_v": _rule(str, choices=tuple(KV_TYPES)),
    "flash_attn": _rule(bool), "offload_kqv": _rule(bool), "swa_full": _rule(bool), "kv_unified": _rule(bool),
    "model": _rule(str), "fim_family": _rule(str),
    "fim_template": _rule(str), "fim_order": _rule(str, choices=("psm", "spm")),
    "max_middle_tokens": _rule(int, 1, 1 << 20), "idle_chunk_tokens": _rule(int, 1, 1 << 16),
    "idle_chunk_ms": _rule(float, 1, 60_000), "grow_share": _rule(float, 0, 0.9),
    "grow_window_ms": _rule(float, 0, 60_000), "answer_cache": _rule(int, 0, 1 << 16),
    "drafts": _rule(bool),
    "n_gpu_layers": _rule(int, 0, 100_000), "main_gpu": _rule(int, 0, 1024),
    "store": _rule(bool), "state_dir": _rule(str), "ram_mb": _rule(float, 0, 1 << 24),
    "disk_mb": _rule(float, 0, 1 << 30), "min_state_tokens": _rule(int, 0, 1 << 21),
    "sparse_budget": _rule(float, 0, 1), "sparse_min_tokens": _rule(int, 0, 1 << 21),
    "sparse_alpha": _rule(float, 0, 1000), "sparse_shrink_to": _rule(float, 0, 1),
    "backend_api": _rule(str, choices=("llama-server", "openai")), "backend_model": _rule(str),
    "api_key": _rule(str), "local_fallback": _rule(bool), "backend_timeout_ms": _rule(float, 100, 3_600_000),
    "repo_context": _rule(bool),
}


class Secret(str):
    """A string that prints as ``***`` (str(), repr(), f-strings), so an API key in a config never
    reaches a log line or a benchmark's saved settings; JSON still carries its value."""

    def __repr__(self) -> str:
        return "'***'"

    __str__ = __format__ = lambda self, *_: "***"


def check_url(url: str) -> str:
    """``url`` if it is an http(s) URL with a host and no credentials in it (ConfigError if not)."""
    if not isinstance(url, str):
        raise ConfigError(f"backend URL must be a string, not {url!r}")
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"backend URL must be http://host[:port] or https://..., not {url!r}")
    if parts.username or parts.password:
        raise ConfigError("backend URL must not hold credentials: set api_key or EFIM_API_KEY")
    try:
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError:
        raise ConfigError(f"backend URL has a bad port: {url!r}") from None
    return url.strip().rstrip("/")


def _backends(v) -> tuple[str, ...]:
    """``backend``: a list of URLs (TOML), or one string of comma-separated URLs (the command line)."""
    if isinstance(v, str):
        v = [u for u in v.split(",") if u.strip()]
    if not isinstance(v, (list, tuple)):
        raise ConfigError(f"'backend' must be a list of URLs, not {v!r}")
    return tuple(check_url(u) for u in v)


def _validate(obj) -> None:
    """Check every field of a config dataclass against RULES; ints given for floats become floats."""
    for f in fields(obj):
        v, rule = getattr(obj, f.name), RULES.get(f.name)
        if rule is None or (v is None and f.default is None):
            continue
        try:
            v2 = check(f.name, v, rule)
        except InvalidParams as e:
            raise ConfigError(f"{str(e).removeprefix('invalid params: ')}, not {v!r}") from None
        if isinstance(v2, str) and "\0" in v2:
            raise ConfigError(f"{f.name!r} must not contain a NUL character")
        if type(v2) is not type(v):
            object.__setattr__(obj, f.name, v2)


def config_home() -> Path:
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "efim"


def cache_home() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "efim"


def state_home() -> Path:
    return Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "efim"


@dataclass(frozen=True)
class ContextParams:
    n_ctx_seq: int = 4096  # tokens per slot
    n_slots: int = 4
    n_batch: int = 512
    n_threads: int = 0  # threads for single-token decodes; 0: the free cores (engine/cpu.py)
    n_threads_batch: int = 0  # threads for multi-token batches (prefill); 0: the free cores
    type_k: str = "f16"
    type_v: str = "f16"
    flash_attn: bool = False
    offload_kqv: bool = True
    swa_full: bool = True  # keeps sliding-window models truncatable at any position
    kv_unified: bool = False  # False: one KV stream per slot, so attention never scans other slots' cells

    def __post_init__(self):
        _validate(self)


@dataclass(frozen=True)
class Config:
    """Everything the engine needs; each field can be set in config.toml."""

    model: str | None = None  # GGUF path; None: the bundled default model
    layout: str | None = None  # "efim" | "fim"; None: the model's (engine/models.py: efim)
    heal: bool | None = None  # token healing when a request does not say; None: the model's (on)
    fim_family: str | None = None  # force a family template (qwen, deepseek, starcoder, ...)
    fim_template: str | None = None  # text markers "PRE,SUF,MID[,psm|spm]" for models without FIM tokens
    fim_order: str | None = None  # "psm" | "spm"; None: the template's own
    max_tokens: int = 64
    max_middle_tokens: int = 256  # re-anchor (and recompute the suffix) past this
    # Latency budget: a prompt whose new tokens would take longer than this to prefill (measured
    # online) is reduced to the context nearest the cursor; idle time grows it back. 0: off.
    # 300 ms: the paced replay's p95 stays under 400 ms on a 0.5B model on 2 cores (docs/benchmarks.md).
    max_prompt_ms: float = 300.0
    idle_chunk_tokens: int = 64  # idle prefill yields to a request between chunks of at most this size,
    idle_chunk_ms: float = 50.0  # and of what prefills in about this long (so a request waits little)
    # Share of a completion's time after its first token, up to grow_window_ms after the request
    # came, given to growing its file's reduced plan: while someone types, most completions are
    # superseded before they end and the daemon is never idle, so growth rides along (one idle
    # chunk at a time). 0: grow only when idle.
    grow_share: float = 0.5
    grow_window_ms: float = 500.0
    # Answers kept by content (model, plan, options), shared by every client of a daemon; 0: off.
    answer_cache: int = 256
    # Greedy answers verify drafted tokens (the suffix, n-grams of the file and of earlier answers) in
    # batches (engine/drafts.py). Off by default: llama.cpp's CPU logits depend on the batch, so on
    # some models (gemma3-270m) a near-tie can flip and the answer differ from one-token decoding.
    drafts: bool = False
    context: ContextParams = field(default_factory=ContextParams)
    n_gpu_layers: int = 0
    main_gpu: int = 0
    # KV state store (RAM and disk tiers); live slots are bounded by context.n_slots x n_ctx_seq.
    store: bool = True
    state_dir: str | None = None  # default: $XDG_STATE_HOME/efim/kv
    ram_mb: float = 512.0
    disk_mb: float = 4096.0
    min_state_tokens: int = 64
    # InfiniGen sparse restore (opt-in, approximate): restore only this fraction of a saved state's
    # cells when it has at least sparse_min_tokens tokens. 0: off. Needs scripts/calibrate_infinigen.py.
    sparse_budget: float = 0.0
    sparse_min_tokens: int = 4096
    sparse_alpha: float = 4.0
    sparse_shrink_to: float = 0.0  # disk pressure: shrink long states to this fraction before evicting
    # Remote backends (docs/team.md): replicas that run the token prompts; the model above is then
    # loaded for its vocabulary only, unless local_fallback keeps it whole to answer when they fail.
    backend: tuple[str, ...] = ()  # http(s) URLs; one file's requests go to one of them
    backend_api: str = "llama-server"  # "llama-server" (/completion) | "openai" (/v1/completions: vLLM, SGLang)
    backend_model: str = "default"  # the model name an OpenAI-compatible server wants
    api_key: str | None = None  # sent as a Bearer token; EFIM_API_KEY overrides it; never printed
    local_fallback: bool = False
    backend_timeout_ms: float = 120_000.0  # a remote request's deadline: every replica it tries, every event
    # Repository context (docs/repo-context.md): the project's map and the definitions a file imports,
    # before its prefix in every plan of the file (a file in a git work tree). Off: file-only prompts.
    repo_context: bool = False

    def __post_init__(self):
        if not isinstance(self.context, ContextParams):
            raise ConfigError("'context' must be a table of context settings")
        _validate(self)
        object.__setattr__(self, "backend", _backends(self.backend))
        if self.api_key is not None:
            object.__setattr__(self, "api_key", Secret(self.api_key))

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "Config":
        """The inverse of to_json (unknown keys are a ConfigError)."""
        if not isinstance(d, dict) or not isinstance(d.get("context", {}), dict):
            raise ConfigError("configuration must be a JSON object")
        d = dict(d)
        return cls().with_overrides(**d.pop("context", {}), **d)

    def resolved(self) -> "Config":
        """Relative paths made absolute (for a process that runs elsewhere)."""
        abs_ = lambda p: str(Path(p).expanduser().resolve()) if p else p
        return replace(self, model=abs_(self.model), state_dir=abs_(self.state_dir))

    def with_overrides(self, **kw) -> "Config":
        ctx_names = {f.name for f in fields(ContextParams)}
        ctx_kw = {k: v for k, v in kw.items() if k in ctx_names and v is not None}
        top = {k: v for k, v in kw.items() if k not in ctx_names and v is not None}
        unknown = set(top) - {f.name for f in fields(Config)}
        if unknown:
            raise ConfigError(f"unknown config keys: {', '.join(sorted(unknown))}")
        return replace(self, context=replace(self.context, **ctx_kw), **top)


def load(path: str | Path | None = None) -> Config:
    """Read config.toml (``path``, ``EFIM_CONFIG`` or the XDG default), then ``EFIM_MODEL``.

    Only the XDG default may be missing; a file named by ``path`` or ``EFIM_CONFIG`` must exist."""
    named = path or os.environ.get("EFIM_CONFIG")
    where = "EFIM_CONFIG=" if not path and named else ""
    path = Path(named or config_home() / "config.toml")
    cfg = Config()
    if named and not path.is_file():
        raise ConfigError(f"{where}{path}: " + ("not a file" if path.exists() else "no such file"))
    if path.is_file():
        try:
            data = tomllib.loads(path.read_text("utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError, OSError) as e:
            raise ConfigError(f"{path}: {e}") from None
        ctx = data.pop("context", {})
        if not isinstance(ctx, dict):
            raise ConfigError(f"{path}: 'context' must be a table ([context])")
        try:
            cfg = cfg.with_overrides(**ctx, **data)
        except (ConfigError, TypeError) as e:
            raise ConfigError(f"{path}: {e}") from None
    if os.environ.get("EFIM_MODEL"):
        cfg = replace(cfg, model=os.environ["EFIM_MODEL"])
    return cfg
