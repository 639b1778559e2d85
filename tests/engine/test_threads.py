"""Automatic threads: the engine decodes with the cores other processes leave free."""

import os
import subprocess
import sys
import threading
import time

import pytest

from efim_local.engine import CompletionRequest, Engine
from efim_local.request import Options
from efim_local.engine.cpu import FreeCores

from tests.helpers import small_config, wait_until

CORES = len(os.sched_getaffinity(0))
SPIN = [sys.executable, "-c", "import time\nt = time.time() + 30\nprint(flush=True)\nwhile time.time() < t: pass"]


def _spin(until: float) -> None:
    while time.monotonic() < until:
        pass


def _window(cores: FreeCores, seconds: float = 0.8) -> int:
    time.sleep(seconds)
    return cores.sample()


@pytest.fixture
def spinner():
    p = subprocess.Popen(SPIN, stdout=subprocess.PIPE)
    p.stdout.readline()  # it printed a line: it spins from now on
    yield p
    p.kill()
    p.wait()
    p.stdout.close()


@pytest.mark.skipif(CORES < 2, reason="needs two cores")
def test_a_busy_process_takes_a_core(spinner):
    cores = FreeCores(every=0.5)
    free = _window(cores)
    assert cores.others >= 0.7 and free <= CORES - 1


def test_this_process_own_work_is_not_counted():
    cores = FreeCores(every=0.5)
    baseline = (_window(cores), cores.others)[1]
    spin = threading.Thread(target=_spin, args=(time.monotonic() + 0.8,))
    spin.start()
    _window(cores)
    spin.join()
    assert cores.others < baseline + 0.5  # a whole core of our own work added nothing


@pytest.mark.skipif(CORES < 2, reason="needs two cores")
def test_the_engine_follows_the_free_cores(tiny_model, spinner):
    with Engine(small_config(n_threads=0, n_threads_batch=0), tiny_model) as e:
        e.cores.every = 0.3
        assert e.status()["threads_auto"]
        wait_until(lambda: e.cores.sample() < CORES, 10, "the engine to see the spinner take a core")
        e.complete(CompletionRequest("def f(x):\n    return ", 21, path="t.py", max_tokens=2))
        st = e.status()
        assert st["cores_free"] <= CORES - 1 and (st["threads"], st["threads_batch"]) == (st["cores_free"],) * 2
    with Engine(small_config(n_threads=1, n_threads_batch=2), tiny_model) as e:  # set by hand: kept
        e.complete(CompletionRequest("def f(x):\n    return ", 21, path="t.py", max_tokens=2))
        st = e.status()
        assert not st["threads_auto"] and (st["threads"], st["threads_batch"]) == (1, 2)


@pytest.mark.skipif(CORES < 2, reason="needs two cores")
def test_one_long_answer_adapts_to_a_busy_core(tiny_model, spinner):
    """An in-process run (``efim complete --no-daemon``) is one long answer right after the engine
    starts: threads must follow the load during it, and the engine's own spinning threads must not
    hide the other process (beside two of them it gets only ~2/3 of a core)."""
    with Engine(small_config(n_threads=0, n_threads_batch=0, n_ctx_seq=4096), tiny_model) as e:
        e.cores = FreeCores(every=0.1)  # a fresh window: the first decodes use every core
        e.cores._first = False  # (not the runnable-tasks guess: the windows during the answer must adapt)
        assert e.cores.sample() == CORES
        t0 = time.monotonic()
        out = e.complete(CompletionRequest("def f(x):\n    return ", 21, path="t.py", max_tokens=3000,
                                           ignore_eog=True))
        assert time.monotonic() - t0 > 0.2 and out.tokens.generated > 100  # several windows
        st = e.status()
        assert st["cores_free"] == CORES - 1 and st["threads"] == CORES - 1, st


@pytest.mark.skipif(CORES < 2, reason="needs two cores")
def test_the_first_decode_already_sees_a_busy_core(spinner):
    """Right after the engine starts there is no window yet: the runnable tasks count instead
    (an in-process run's first prefill is one long decode)."""
    cores = FreeCores(every=10)
    assert cores.sample() <= CORES - 1 and cores.others >= 1


def test_the_wait_on_the_run_queue_reveals_what_others_want():
    from efim_local.engine.cpu import demand

    # 2 cores; a spinning process beside two decoding threads: each of the three runs 2/3 of the time.
    assert demand(2 / 3, 4 / 3, 2 / 3, 2) == pytest.approx(1.0)
    assert demand(0.5, 0.0, 0.0, 2) == 0.5  # this process idle: use is demand
    assert demand(1.9, 0.5, 2.0, 2) == 2.0  # never more than every core


def test_thread_count_does_not_change_an_answer(tiny_model):
    """Automatic threads may change between a prompt's prefill and a later keystroke's: ggml gives
    each output row to one thread, so the numbers, not just the argmax, are the same."""
    from tests.helpers import SOURCES

    text = SOURCES[0][:3000]
    with Engine(small_config(n_threads=1, n_threads_batch=1), tiny_model) as e:
        tokens = e.plan(CompletionRequest(text, len(text), path="a.py")).tokens
        runs = []
        for n in (1, 2, 1):
            e.ctx.set_threads(n, n)
            out = e.run(tokens, Options(max_tokens=16, ignore_eog=True), cold=True)
            runs.append((out.token_ids, e.ctx.logits(0).tobytes()))
        assert runs[0] == runs[1] == runs[2]


def test_flash_attention_keeps_its_threads(tiny_model):
    """ggml splits a flash-attention decode over the KV by thread count: with it on, the thread count
    stays what the configuration gives, so an answer never depends on the machine's load."""
    with Engine(small_config(n_threads=0, n_threads_batch=0, flash_attn=True), tiny_model) as e:
        assert e.cores is None and not e.status()["threads_auto"]


def test_threads_fall_at_once_and_rise_on_two_windows_in_a_row():
    """One noisy window must not put a thread beside a busy process (9x slower); a real change does."""
    cores = FreeCores(every=10)
    cores.cores = 4
    cores.free = 4
    cores._set(2.0)
    assert cores.free == 2  # at once
    cores._set(0.0)
    assert cores.free == 2  # one window: noise
    cores._set(2.0)
    cores._set(0.0)
    assert cores.free == 2  # the streak was broken
    cores._set(1.0)
    assert cores.free == 3  # two in a row: the smaller of the two


@pytest.mark.skipif(CORES < 2, reason="needs two cores")
def test_status_measures_a_window_of_its_own(spinner):
    """``efim status`` measures (``FreeCores.measure``): the engine's last window may be a long
    pause's, or none at all (a one-shot status showed ``cores_used_by_others 0.0`` at a load of 3)."""
    cores = FreeCores(every=10)
    cores._first = False  # (no runnable-tasks guess either: only a measured window counts)
    probe = cores.policy.cpu_probe_s
    t0 = time.monotonic()
    assert cores.measure() >= 0.75 and cores.free <= CORES - 1 and cores.others >= 0.75
    assert time.monotonic() - t0 >= probe
    t1 = time.monotonic()
    cores.measure()  # a status polled again: the window just measured, no new wait
    assert time.monotonic() - t1 < probe
    time.sleep(probe)
    t2 = time.monotonic()
    assert cores.measure() >= 0.75 and time.monotonic() - t2 < probe  # from the last window's end: no wait
