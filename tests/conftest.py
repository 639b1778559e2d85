import os
import sys
from pathlib import Path

import pytest

from efim_local.training import tinymodel
from efim_local.llama import ContextParams
from efim_local.config import Config

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session", autouse=True)
def _isolated_home(tmp_path_factory):
    """Keep tests away from the user's config, cache and state."""
    home = tmp_path_factory.mktemp("home")
    for var in ("XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_STATE_HOME", "XDG_RUNTIME_DIR"):
        os.environ[var] = str(home / var.lower())
    os.environ.pop("EFIM_MODEL", None)
    os.environ.pop("EFIM_CONFIG", None)
    yield


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    return tinymodel.build(tmp_path_factory.mktemp("models") / "tiny.gguf")


@pytest.fixture(scope="session")
def tiny_model_swa(tmp_path_factory) -> Path:
    """A Gemma-3-style model with a 32-token sliding window."""
    return tinymodel.build(tmp_path_factory.mktemp("models") / "tiny-swa.gguf", swa=32)


@pytest.fixture(scope="session")
def tiny_model_nofim(tmp_path_factory) -> Path:
    return tinymodel.build(tmp_path_factory.mktemp("models") / "tiny-nofim.gguf", fim_tokens=False)


def small_config(**kw) -> Config:
    ctx = dict(n_ctx_seq=1024, n_slots=3, n_batch=64, n_threads=2)
    ctx.update({k: kw.pop(k) for k in list(kw) if k in ContextParams.__dataclass_fields__})
    return Config(context=ContextParams(**ctx), max_tokens=8, **kw)


@pytest.fixture(scope="session")
def model(tiny_model):
    from efim_local.llama import Model

    with Model(tiny_model) as m:
        yield m


def efim_cli(*args, input=None, env=None):
    import subprocess

    e = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "efim_local.cli", *args], input=input,
                          capture_output=True, env=e, cwd=ROOT, timeout=120)
