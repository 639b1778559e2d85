"""Issue 38 at the engine: a token id from outside the vocabulary never reaches llama.cpp (which
aborts the process on one: ``std::out_of_range``), and background work with replicas measures
nothing locally without a local decoder. The hostile server itself is tests/e2e/test_remote_hostile.py (the daemon) and
tests/unit/test_backend.py (the parser and the pool)."""

from __future__ import annotations

import subprocess
import sys

from efim_local.engine.remote import RemoteEngine
from tests.helpers import ROOT, small_config


def test_a_token_id_outside_the_vocabulary_is_an_error_not_an_abort(tiny_model):
    """The last line of defence: ``Model.piece`` checks the id itself (in a child process: without
    the check llama.cpp aborts it)."""
    code = f"""
from efim_local.errors import BackendError
from efim_local.llama import Model
with Model({str(tiny_model)!r}, vocab_only=True) as m:
    for t in (-1, -5, m.n_vocab, 1 << 40):
        for special in (False, True):
            try:
                m.piece(t, special)
            except BackendError as e:
                print(e)
    print(m.piece(m.n_vocab - 1) == m.piece(m.n_vocab - 1, False))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    assert len(lines) == 9 and lines[-1] == "True", r.stdout
    assert all("is not in the model's vocabulary" in ln for ln in lines[:-1]), r.stdout


def test_background_work_of_a_remote_only_engine(tiny_model):
    """`efim daemon start --backend URL` logged a traceback: calibration asked a remote-only engine
    for its decoder. It has none: nothing to measure (the budget's speed is the replicas')."""
    with RemoteEngine(small_config(backend=["http://127.0.0.1:9"], heal=True), tiny_model) as remote:
        assert remote.default_heal  # (the healer's index is the decoder's: not built either)
        remote.calibrate()
        assert not remote.speed.known
