"""Known FIM models, downloads into the XDG data dir, and the checks a model passes before use.

The table starts from llama.cpp's own ``--fim-qwen-*`` presets (common/arg.cpp) and adds the other
FIM families efim has templates for. Sizes are the GGUF file's; ``ram_mb`` is what serving it takes
with efim's default context (4 slots x 4096 tokens). The layout each gets is the engine's rule
(engine/models.py choose_layout), not a column of this table. ``EFIM_KNOWN_MODELS`` names a JSON file of
extra entries (a list of objects with the same fields), which take precedence over the table.

Nothing here loads llama.cpp: the GGUF check reads metadata with the ``gguf`` package.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from .errors import ConfigError, DownloadError, ModelError


@dataclass(frozen=True)
class KnownModel:
    name: str
    repo: str  # Hugging Face repository, owner/name
    file: str  # the GGUF file in it
    family: str  # FIM template family (prompt/templates.py)
    params: str  # parameter count, e.g. "1.5B"
    size_mb: int  # the file
    ram_mb: int  # serving it: weights, 4 x 4096 tokens of KV, buffers
    revision: str = "main"


Q = "ggml-org/Qwen2.5-Coder-{}-Q8_0-GGUF"
KNOWN: tuple[KnownModel, ...] = (
    # llama.cpp's presets: --fim-qwen-1.5b-default, -3b, -7b, the 0.5B draft of -7b-spec, -14b-spec, -30b
    KnownModel("qwen2.5-coder-0.5b", Q.format("0.5B"), "qwen2.5-coder-0.5b-q8_0.gguf", "qwen", "0.5B", 531, 900),
    KnownModel("qwen2.5-coder-1.5b", Q.format("1.5B"), "qwen2.5-coder-1.5b-q8_0.gguf", "qwen", "1.5B", 1646, 2100),
    KnownModel("qwen2.5-coder-3b", Q.format("3B"), "qwen2.5-coder-3b-q8_0.gguf", "qwen", "3B", 3290, 4000),
    KnownModel("qwen2.5-coder-7b", Q.format("7B"), "qwen2.5-coder-7b-q8_0.gguf", "qwen", "7B", 8100, 9000),
    KnownModel("qwen2.5-coder-14b", Q.format("14B"), "qwen2.5-coder-14b-q8_0.gguf", "qwen", "14B", 15700, 17300),
    KnownModel("qwen3-coder-30b-a3b", "ggml-org/Qwen3-Coder-30B-A3B-Instruct-Q8_0-GGUF",
               "qwen3-coder-30b-a3b-instruct-q8_0.gguf", "qwen", "30B-A3B", 32500, 34000),
    KnownModel("deepseek-coder-1.3b", "TheBloke/deepseek-coder-1.3b-base-GGUF",
               "deepseek-coder-1.3b-base.Q4_K_M.gguf", "deepseek", "1.3B", 874, 1900),
    KnownModel("deepseek-coder-6.7b", "TheBloke/deepseek-coder-6.7B-base-GGUF",
               "deepseek-coder-6.7b-base.Q4_K_M.gguf", "deepseek", "6.7B", 4080, 6200),
    KnownModel("starcoder2-3b", "second-state/StarCoder2-3B-GGUF", "starcoder2-3b-Q4_K_M.gguf",
               "starcoder", "3B", 1850, 2600),
    KnownModel("codegemma-2b", "bartowski/codegemma-2b-GGUF", "codegemma-2b-Q4_K_M.gguf",
               "codegemma", "2.5B", 1630, 2500),
    KnownModel("codestral-22b", "bartowski/Codestral-22B-v0.1-GGUF", "Codestral-22B-v0.1-Q4_K_M.gguf",
               "codestral", "22B", 13300, 17000),
)


def models_dir() -> Path:
    """``$XDG_DATA_HOME/efim/models``: where ``efim models pull`` puts downloads."""
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "efim" / "models"


def known_models() -> list[KnownModel]:
    """The table, with the entries of the ``EFIM_KNOWN_MODELS`` file on top (same name: replaced)."""
    out = {m.name: m for m in KNOWN}
    extra = os.environ.get("EFIM_KNOWN_MODELS")
    if extra:
        try:
            rows = json.loads(Path(extra).read_text("utf-8"))
        except (OSError, ValueError) as e:
            raise ConfigError(f"EFIM_KNOWN_MODELS: {e}") from None
        names = {f.name for f in fields(KnownModel)}
        if not isinstance(rows, list) or not all(isinstance(r, dict) and set(r) <= names for r in rows):
            raise ConfigError(f"EFIM_KNOWN_MODELS: {extra} must be a JSON list of objects with fields "
                              f"{', '.join(sorted(names))}")
        try:
            out.update((r["name"], KnownModel(**r)) for r in rows)
        except (TypeError, KeyError) as e:
            raise ConfigError(f"EFIM_KNOWN_MODELS: {extra}: {e}") from None
    return list(out.values())


def find(name: str) -> KnownModel | None:
    return next((m for m in known_models() if m.name == name.lower()), None)


def local_path(m: KnownModel) -> Path:
    """Where a known model lives once pulled."""
    return models_dir() / m.repo / m.file


def parse_spec(spec: str) -> KnownModel:
    """A known model's name, or ``hf:OWNER/REPO/FILE.gguf`` (any GGUF on the hub)."""
    if spec.startswith("hf:"):
        m = re.fullmatch(r"([\w.-]+/[\w.-]+)/([\w./-]+\.gguf)", spec[3:])
        if not m or ".." in spec:
            raise ModelError(f"expected hf:OWNER/REPO/FILE.gguf, not {spec!r}")
        return KnownModel(m.group(2).rpartition("/")[2].removesuffix(".gguf").lower(), m.group(1), m.group(2),
                          "", "?", 0, 0)
    m = find(spec)
    if m is None:
        raise ModelError(f"unknown model {spec!r}; `efim models list` shows the known ones, "
                         "or pull hf:OWNER/REPO/FILE.gguf")
    return m


def installed() -> list[dict]:
    """The GGUF files under models_dir(): path, size, and the known model each one is (if any)."""
    root = models_dir()
    by_path = {local_path(m): m for m in known_models()}
    out = []
    if root.is_dir():
        for p in sorted(root.rglob("*.gguf")):
            if ".cache" in p.relative_to(root).parts or not p.is_file():  # huggingface_hub's partial downloads
                continue
            m = by_path.get(p)
            out.append({"name": m.name if m else p.stem, "path": str(p), "size_mb": round(p.stat().st_size / 2**20)})
    return out


def listing() -> dict:
    """``efim models list``: known models (with whether each is here) and every installed file."""
    from .engine.models import choose_layout

    here = {Path(i["path"]) for i in installed()}
    # Every known model has FIM tokens and no fragment training: the engine's rule gives its layout.
    layout = choose_layout(lambda key: None, None)[0]
    known = [{**asdict(m), "layout": layout, "installed": local_path(m) in here, "path": str(local_path(m))}
             for m in known_models()]
    return {"dir": str(models_dir()), "known": known, "installed": installed()}


def pull(spec: str, progress: bool = True) -> dict:
    """Download a known model (or ``hf:REPO/FILE``) with huggingface_hub into models_dir(): resumes a
    partial download, skips a complete one, shows a progress bar, uses the usual HF token
    (``HF_TOKEN``, ``hf auth login``) and honours ``HF_ENDPOINT``. Then checks it (see check())."""
    m = parse_spec(spec)
    import huggingface_hub
    from huggingface_hub import errors as hf_errors
    from huggingface_hub.utils import disable_progress_bars, enable_progress_bars

    (disable_progress_bars if not progress else enable_progress_bars)()
    try:
        path = huggingface_hub.hf_hub_download(m.repo, m.file, revision=m.revision,
                                               local_dir=models_dir() / m.repo)
    except hf_errors.RepositoryNotFoundError:
        raise DownloadError(f"repository {m.repo} not found (or private: set HF_TOKEN)") from None
    except hf_errors.EntryNotFoundError:
        raise DownloadError(f"{m.file} not found in {m.repo}") from None
    except (hf_errors.HfHubHTTPError, hf_errors.LocalEntryNotFoundError, OSError) as e:
        raise DownloadError(f"downloading {m.repo}/{m.file} failed: {e}") from None
    info = check(path)
    return {"name": m.name, "path": str(path), **info}


def check(path: str | Path) -> dict:
    """A model file's facts from its GGUF metadata, without loading it: architecture, FIM tokens,
    fragment training, and the layout efim would pick. ModelError if it is not a GGUF."""
    from .engine.models import choose_layout
    from .llama.meta import KEY_FRAGMENT, KEY_LAYOUT

    path = Path(path)
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise ModelError(f"cannot read {path}: {e.strerror or e}") from None
    if magic != b"GGUF":
        raise ModelError(f"{path} is not a GGUF file")
    import gguf

    try:
        reader = gguf.GGUFReader(str(path), "r")
    except (ValueError, OSError, IndexError) as e:
        raise ModelError(f"{path}: unreadable GGUF metadata ({e})") from None

    def meta(key: str):
        f = reader.fields.get(key)
        if f is None:
            return None
        v = f.contents()
        return str(v).lower() if isinstance(v, bool) else v

    fim = {k: meta(f"tokenizer.ggml.fim_{k}_token_id") for k in ("pre", "suf", "mid")}
    family = None
    if fim["pre"] is None or fim["suf"] is None:
        family = _family_by_tokens(reader)
    layout, reason = choose_layout(meta, None)
    return {"architecture": meta("general.architecture"), "fim": fim["pre"] is not None or family is not None,
            "fim_source": "gguf" if fim["pre"] is not None else (f"family:{family}" if family else None),
            "fragment_trained": (meta(KEY_FRAGMENT) or "") == "true", "trained_layout": meta(KEY_LAYOUT),
            "layout": layout, "layout_reason": reason, "size_mb": round(path.stat().st_size / 2**20)}


def _family_by_tokens(reader) -> str | None:
    """The FIM family whose marker tokens the vocabulary holds (llama.cpp infers ids the same way)."""
    from .prompt.templates import FAMILIES

    f = reader.fields.get("tokenizer.ggml.tokens")
    if f is None:
        return None
    vocab = set(f.contents())
    return next((name for name, fam in FAMILIES.items() if fam.pre in vocab and fam.suf in vocab), None)


def resolve_use(spec: str) -> Path:
    """``efim models use``: a known model's downloaded file, or a GGUF path; checked to have FIM tokens."""
    m = find(spec)
    if m is not None:
        path = local_path(m)
        if not path.is_file():
            raise ModelError(f"{m.name} is not downloaded; run: efim models pull {m.name}")
    else:
        path = Path(spec).expanduser()
        if not path.is_file():
            raise ModelError(f"{spec!r} is neither a known model nor a GGUF file")
    info = check(path)
    if not info["fim"]:
        raise ModelError(f"{path} has no FIM tokens; set fim_template in the config to use it with text markers")
    return path.resolve()


def config_file() -> Path:
    """The user config file ``efim models use`` writes (``EFIM_CONFIG``, else the XDG default)."""
    from .config import config_home

    return Path(os.environ.get("EFIM_CONFIG") or config_home() / "config.toml")


def write_model_setting(model: Path) -> Path:
    """Set ``model = "..."`` in the user config file, keeping everything else in it; atomic."""
    import tomllib

    path = config_file()
    text = path.read_text("utf-8") if path.is_file() else ""
    line = f"model = {json.dumps(str(model))}"  # a JSON string is a valid TOML basic string
    lines = text.splitlines()
    top = next((i for i, s in enumerate(lines) if s.lstrip().startswith("[")), len(lines))  # before any table
    hit = next((i for i in range(top) if re.match(r"\s*model\s*=", lines[i])), None)
    if hit is not None:
        lines[hit] = line
    else:
        lines.insert(0, line)
    new = "\n".join(lines) + "\n"
    try:
        tomllib.loads(new)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: {e}; fix it, then run this again") from None
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(new, "utf-8")
    tmp.replace(path)
    return path
