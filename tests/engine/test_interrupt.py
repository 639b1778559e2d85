"""Idle prefill yields to a request even inside one long tokenize call (issue 17, item 12)."""

import threading
import time

import pytest

from efim_local.engine import tokenizing as interrupt
from efim_local.errors import Cancelled

BIG = ("value = compute(1, 2)\n" * 50_000)[:1_000_000]  # about 1 s of tokenizing for the tiny model


def test_a_long_tokenize_is_cut_short_and_its_result_kept(model):
    calls = []

    def counted(text, *a, **kw):
        calls.append(len(text))
        return model.tokenize(text, *a, **kw)

    t0 = time.monotonic()
    reference = model.tokenize(BIG)
    alone = time.monotonic() - t0
    stop_at = time.monotonic() + 0.05
    tok = interrupt.interruptible(counted, lambda: time.monotonic() > stop_at)
    with pytest.raises(Cancelled):
        tok(BIG)
    late = time.monotonic() - stop_at
    assert late < max(0.25, alone / 3), f"Cancelled {late:.2f} s after the stop (the call takes {alone:.2f} s)"
    interrupt._running.join(30)  # the call went on in the background...
    assert interrupt.interruptible(counted, lambda: False)(BIG) == reference  # ...and its result is reused
    assert calls == [len(BIG)]
    assert interrupt.interruptible(counted, lambda: False)("short") == model.tokenize("short")  # inline


def test_a_second_call_waits_for_the_first_interruptibly(model):
    """At most one background call: a new one waits (and can still be stopped) meanwhile."""
    tok = interrupt.interruptible(model.tokenize, lambda: time.monotonic() > deadline)
    deadline = time.monotonic() + 0.02
    with pytest.raises(Cancelled):
        tok(BIG + "#1")
    first = interrupt._running
    deadline = time.monotonic() + 0.05
    with pytest.raises(Cancelled):
        tok(BIG + "#2")  # waits for the first, does not start a second thread
    assert interrupt._running is first
    first.join(30)
    assert threading.active_count() < 50


def test_engine_prefill_with_an_interruptible_tokenizer_stops_at_once(tmp_path, tiny_model):
    from efim_local.api import open_engine

    from tests.helpers import small_config

    # A slot this big tokenizes about 250 KB each side of the cursor (a smaller one cuts the text more).
    with open_engine(small_config(model=str(tiny_model), store=False, n_ctx_seq=32768, n_slots=1)) as engine:
        assert engine.planner.text_span() > 200_000
        stop_at = time.monotonic() + 0.05
        should_stop = lambda: time.monotonic() > stop_at  # noqa: E731
        with pytest.raises(Cancelled), engine.tokenizer.stopping(should_stop):
            engine.prefill("big.py", BIG, len(BIG) // 2, should_stop)
        assert time.monotonic() - stop_at < 0.5
        assert engine.planner.tokenize is engine.tokenizer and engine.tokenizer.run == engine.model.tokenize  # as before
        interrupt.drain()  # before the model is freed


def test_an_interruptible_batch_stops_and_drops_only_its_own_kv(model, caplog):
    """A prompt batch stops at the interrupt flag (background work's: a request came), and its KV is
    dropped; the same flag leaves a request's batch alone. The flag is read without the GIL (libc's
    strlen as ggml's abort callback), so this also checks that trick on this platform."""
    from efim_local.config import ContextParams
    from efim_local.errors import Interrupted
    from efim_local.llama import Batch, Context

    with Context(model, ContextParams(n_ctx_seq=1024, n_slots=1, n_batch=256)) as ctx:
        batch = Batch(256, 1)
        batch.extend(range(10, 110), 0, 0)
        ctx.decode(batch, interruptible=True)  # flag clear: decodes
        assert ctx.seq_pos_max(0) == 99
        ctx.interrupt()
        batch.clear()
        batch.extend(range(110, 210), 100, 0)
        with caplog.at_level("ERROR", logger="efim.llama"), pytest.raises(Interrupted):
            ctx.decode(batch, interruptible=True)
        assert not caplog.records, "an interrupted batch is routine: llama.cpp's abort errors are debug lines"
        assert ctx.seq_pos_max(0) == 99  # the stopped batch left nothing; the first batch stays
        ctx.decode(batch)  # not interruptible: the flag is ignored
        assert ctx.seq_pos_max(0) == 199
        ctx.clear_interrupt()
        batch.clear()
        batch.extend(range(210, 260), 200, 0)
        ctx.decode(batch, interruptible=True)
        assert ctx.seq_pos_max(0) == 249


def test_a_starved_answer_lets_growth_finish_its_batch(tiny_model):
    """After an answer with little context (growth is what it lacks) a request waits for the
    background batch it lands in; otherwise, and early in a batch, the batch stops."""
    import time as _time

    from efim_local.engine import Engine

    from tests.helpers import small_config

    with Engine(small_config(), tiny_model) as e:
        def flag_after(used, full, span=None):
            e.interruptible(True)
            e.last_context, e.decoder.batch_span = (used, full), span
            e.interrupt()
            return bool(e.ctx._stop[0]), e.decoder.stop_next

        e.growth.patience_s = 1.0  # batches of the usual size (idle chunks grow in quiet spells)
        assert flag_after(100, 3000) == (False, True)  # starved: finish the batch, stop the next
        assert flag_after(e.policy.starved + 1, 3000) == (True, False)
        assert flag_after(100, 100) == (True, False)  # the whole plan: nothing to grow
        now = _time.perf_counter()
        assert flag_after(2000, 3000, (now - 0.1, now + 0.3)) == (True, False)  # early in the batch
        assert flag_after(2000, 3000, (now - 0.3, now + 0.1)) == (False, True)  # late: it finishes
        assert flag_after(100, 3000, (now - 0.1, now + 0.3)) == (False, True)  # starved
        # A batch grown in a quiet spell, 4x the usual: a request waits for at most half of a usual
        # batch (a quarter when starved, the whole usual batch)
        e.growth.patience_s = 0.2
        now = _time.perf_counter()
        assert flag_after(2000, 3000, (now - 0.5, now + 0.3)) == (True, False)
        assert flag_after(2000, 3000, (now - 0.7, now + 0.05)) == (False, True)
        assert flag_after(100, 3000, (now - 0.4, now + 0.4)) == (True, False)
        assert flag_after(100, 3000, (now - 0.6, now + 0.15)) == (False, True)
        e.interruptible(False)


def test_idle_chunks_grow_in_a_quiet_spell(tiny_model):
    """Right after a request an idle chunk prefills in about ``idle_chunk_ms``; as the quiet goes on
    it may last half of it (a bigger batch prefills more tokens a second), up to ``idle_chunk_tokens``."""
    from efim_local.engine import Engine
    from efim_local.engine.speed import PrefillSpeed

    from tests.helpers import small_config

    with Engine(small_config(idle_chunk_ms=50, idle_chunk_tokens=64), tiny_model) as e:
        e.speed = PrefillSpeed.fixed(5.0)  # 5 ms a token
        e.active_at = time.perf_counter()
        assert e.growth.idle_chunk(0) == 10
        assert e.growth.patience_s == pytest.approx(0.05)
        e.active_at -= 0.4  # 400 ms of quiet: chunks of about 200 ms
        assert 38 <= e.growth.idle_chunk(0) <= 40
        e.active_at -= 10
        assert e.growth.idle_chunk(0) == 64
        assert e.growth.patience_s == pytest.approx(0.05)  # the usual chunk's time, for Engine.interrupt


def test_idle_chunks_fill_the_window_a_keystroke_opens(tiny_model):
    """Right after a keystroke no request can come before the editor's debounce (learned: pace.py):
    an idle chunk may fill most of that window, though a request just ran."""
    from efim_local.engine import Engine
    from efim_local.engine.speed import PrefillSpeed

    from tests.helpers import small_config, taught

    with Engine(small_config(idle_chunk_ms=50, idle_chunk_tokens=64), tiny_model) as e:
        e.speed = PrefillSpeed.fixed(5.0)  # 5 ms a token
        now = time.perf_counter()
        e.pace = taught(0.15, now)  # an editor with a 150 ms debounce
        e.active_at = now
        assert e.growth.idle_chunk(0) == 10  # no keystroke since the last request: the usual chunk
        e.pace.typed(time.perf_counter())
        assert 20 <= e.growth.idle_chunk(0) <= 27  # 90% of the ~150 ms left, 5 ms a token
        assert e.growth.patience_s == pytest.approx(0.05)
        e.pace.typed(time.perf_counter() - 0.13)  # 20 ms left: the usual chunk, never less
        assert e.growth.idle_chunk(0) == 10
