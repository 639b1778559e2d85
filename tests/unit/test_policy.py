"""The engine's timing and scheduling policy (engine/policy.py), decided on a clock of the test's own:
no model, no llama.cpp decode, no sleeps.

The expected numbers are written out from the Policy each test injects (the defaults unless it says
otherwise; the comments say how they follow), so a changed value fails the tests that depend on it,
and a decision that ignored the injected policy (a constant of its own, the real clock) fails too."""

from __future__ import annotations

from dataclasses import dataclass, replace
from types import SimpleNamespace

import numpy as np
import pytest

from efim_local.engine import drafts
from efim_local.engine.background import Growth
from efim_local.engine.backends import Local
from efim_local.engine.cpu import FreeCores
from efim_local.engine.decode import Decoder
from efim_local.engine.engine import Engine
from efim_local.engine.pace import Pace
from efim_local.engine.policy import Policy
from efim_local.engine.run import stage_ends
from efim_local.engine.scheduler import Scheduler
from efim_local.engine.speed import PrefillSpeed
from efim_local.engine.tasks import RequestTask
from efim_local.errors import Cancelled


class FakeClock:
    """Seconds that pass only when the test says so."""

    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def policy(clock) -> Policy:
    return Policy(clock=clock)


def teach(pace: Pace, clock: FakeClock, gap: float, n: int) -> None:
    """``n`` keystrokes, each followed by a request ``gap`` s later (the editor's debounce), then a second."""
    for _ in range(n):
        pace.typed()
        clock.advance(gap)
        pace.requested()
        clock.advance(1.0)


def fake_engine(policy: Policy, ms_per_token: float = 5.0, patience_s: float = 0.05, **kw) -> SimpleNamespace:
    """What idle chunks, the scheduler and interrupts read of an engine: its policy, the user's pace, a
    fixed prefill speed, the idle chunk settings, growth's ``patience_s``; no model."""
    e = SimpleNamespace(policy=policy, pace=Pace(policy), speed=PrefillSpeed.fixed(ms_per_token),
                        config=SimpleNamespace(idle_chunk_ms=50, idle_chunk_tokens=64, max_tokens=8),
                        active_at=0.0, interrupted=0, on=[], decoder=None,
                        slots=SimpleNamespace(slots=[object()], free=lambda: []),
                        growth=SimpleNamespace(patience_s=patience_s))
    e.interrupt = lambda: setattr(e, "interrupted", e.interrupted + 1)
    e.interruptible = e.on.append
    e.mark_active = lambda: Engine.mark_active(e)
    e.__dict__.update(kw)
    return e


# -- the user's pace ------------------------------------------------------------------------------------
def test_the_pace_learns_the_editors_debounce_from_request_gaps(clock, policy):
    pace = Pace(policy)
    teach(pace, clock, 0.25, 3)
    assert pace.debounce_s == 0  # fewer than debounce_min_samples (4): no guess
    teach(pace, clock, 0.25, 1)
    assert pace.debounce_s == 0.25
    pace.typed()
    clock.advance(0.125)
    assert pace.window_s() == 0.125  # no request before the debounce ends
    clock.advance(0.125)
    assert pace.window_s() == 0
    # A request more than max_gap_s (2 s) after its keystroke (the user asked by hand) is no sample
    pace.typed()
    clock.advance(2.125)
    pace.requested()
    assert len(pace.gaps) == 4
    pace.typed()
    clock.advance(1.875)
    pace.requested()
    assert len(pace.gaps) == 5


def test_the_debounce_is_a_low_quantile_of_the_gaps(clock, policy):
    pace = Pace(policy)
    for gap in (0.17, 0.15, 0.2, 0.16, 0.3):
        teach(pace, clock, gap, 1)
    assert pace.debounce_s == pytest.approx(0.16)  # debounce_quantile 4: the second smallest of 5
    for _ in range(16):  # debounce_samples (16) later, the first five are forgotten
        teach(pace, clock, 0.5, 1)
    assert pace.debounce_s == pytest.approx(0.5) and len(pace.gaps) == 16
    teach(pace, clock, 1.5, 16)
    assert pace.debounce_s == 1.0  # max_debounce_s


def test_an_injected_policy_sets_the_quantile_and_the_cap(clock):
    pace = Pace(Policy(clock=clock, debounce_quantile=2, max_debounce_s=0.4))
    for gap in (0.1, 0.2, 0.3, 0.5, 0.6):
        teach(pace, clock, gap, 1)
    assert pace.debounce_s == pytest.approx(0.3)  # the middle one
    for _ in range(4):
        teach(pace, clock, 0.9, 1)
    assert pace.debounce_s == 0.4  # 0.6, 0.9: capped


def test_idle_work_holds_for_a_due_request_only_within_the_slack(clock, policy):
    pace = Pace(policy)
    teach(pace, clock, 0.25, 5)
    pace.typed()
    clock.advance(0.125)
    assert pace.hold_s(0.1) == 0  # 125 ms left: a 100 ms batch ends before the request comes
    clock.advance(0.0625)  # 62.5 ms left: it would not
    assert pace.hold_s(0.1) == pytest.approx(0.0625 + 0.03)  # and slack_s: 30 ms
    clock.advance(0.0625 + 0.029)
    assert pace.hold_s(0.1) == pytest.approx(0.001)
    clock.advance(0.002)  # it did not come within the slack: go on
    assert pace.hold_s(0.1) == 0


def test_keystrokes_without_requests_stop_the_holding_after_max_misses(clock, policy):
    pace = Pace(policy)
    teach(pace, clock, 0.25, 5)
    for _ in range(3):  # max_misses
        pace.typed()
        clock.advance(0.125)
        assert pace.hold_s(0.25) > 0
        clock.advance(1.0)
    pace.typed()
    clock.advance(0.125)
    assert pace.hold_s(0.25) == 0
    pace.requested()  # a request came: it holds again
    clock.advance(1.0)
    pace.typed()
    clock.advance(0.125)
    assert pace.hold_s(0.25) > 0


# -- idle chunks ------------------------------------------------------------------------------------
def test_an_idle_chunk_fills_the_window_before_the_next_request(clock, policy):
    """Right after a keystroke no request comes before the debounce: a chunk of ``window_share`` (0.9)
    of what is left of it, at 5 ms a token; never less than the usual one (``idle_chunk_ms``, 50)."""
    e = fake_engine(policy)
    teach(e.pace, clock, 0.25, 8)
    e.active_at = clock()
    growth = Growth(e)
    assert growth.idle_chunk(0) == 10  # no keystroke since the last request: the usual 50 ms
    assert growth.patience_s == 0.05
    e.pace.typed()
    assert Growth(e).idle_chunk(0) == 45  # 0.9 * 250 ms
    clock.advance(0.125)
    assert Growth(e).idle_chunk(0) == 22  # 0.9 * 125 ms
    clock.advance(0.0625)
    assert Growth(e).idle_chunk(0) == 11  # 0.9 * 62.5 ms
    clock.advance(0.03125)
    assert Growth(e).idle_chunk(0) == 10  # 28 ms: the usual chunk, never less


def test_an_idle_chunk_grows_with_the_quiet(clock, policy):
    e = fake_engine(policy, active_at=clock())
    growth = Growth(e)
    assert growth.idle_chunk(0) == 10
    clock.advance(0.25)
    assert growth.idle_chunk(0) == 25  # quiet_share (0.5) of 250 ms of quiet
    clock.advance(10)
    assert growth.idle_chunk(0) == 64  # idle_chunk_tokens at most
    assert growth.patience_s == 0.05  # the usual chunk's time, whatever the quiet


def test_growth_riding_along_a_request_takes_most_of_the_debounce(clock, policy):
    e = fake_engine(policy)
    assert Growth(e).riding_s() == 0.05  # no debounce known: idle_chunk_ms
    teach(e.pace, clock, 0.5, 8)
    assert Growth(e).riding_s() == pytest.approx(0.45)  # window_share (0.9) of it
    assert Growth(e).riding_chunk(0) == 64  # 90 tokens' time: idle_chunk_tokens at most


# -- the scheduler --------------------------------------------------------------------------------
def answered(sched: Scheduler, clock: FakeClock) -> list:
    """A request ends now (what the scheduler does after its last step); its answers."""
    out: list = []
    task = RequestTask("k", None, queued_at=clock())
    task.future.add_done_callback(lambda fut: out.append((fut.result(), fut.exception())))
    sched._end(task, "done", None)
    return out


def test_dirty_slots_are_saved_after_save_delay_of_quiet(clock, policy):
    e = fake_engine(policy)
    sched = Scheduler(e)
    assert sched._idle_due(clock()) == (None, None)  # nothing to do: wait until woken
    assert answered(sched, clock) == [("done", None)]
    assert e.active_at == clock()
    assert sched._idle_due(clock()) == (None, 0.5)  # save_delay
    clock.advance(0.375)
    assert sched._idle_due(clock()) == (None, 0.125)
    answered(sched, clock)  # another keystroke's answer: the quiet starts again
    clock.advance(0.375)
    assert sched._idle_due(clock()) == (None, 0.125)
    clock.advance(0.125)
    assert sched._idle_due(clock()) == (True, None)  # time to save


def test_idle_work_starts_after_a_grace_unless_a_keystroke_opened_a_window(clock, policy):
    e = fake_engine(policy)
    sched = Scheduler(e)
    sched.add_background(lambda engine, stop: None, key="bg")
    answered(sched, clock)
    assert sched._idle_due(clock()) == (None, pytest.approx(0.05))  # idle_grace
    clock.advance(0.04)
    assert sched._idle_due(clock()) == (None, pytest.approx(0.01))
    clock.advance(0.01)
    assert sched._idle_due(clock()) == (False, None)  # background work now
    # An editor with a 60 ms debounce, and a keystroke just came: no request before it ends
    teach(e.pace, clock, 0.0625, 8)
    e.pace.typed()
    answered(sched, clock)
    assert sched._idle_due(clock()) == (False, None)  # at once
    clock.advance(0.015)  # 47.5 ms left: less than the grace
    answered(sched, clock)
    assert sched._idle_due(clock()) == (None, pytest.approx(0.05))


def test_idle_work_holds_when_a_request_is_due_before_a_usual_chunk_would_end(clock, policy):
    """A keystroke came; its request is due (the debounce ends) before 1/hold_share (a quarter) of a
    usual idle chunk would: the chunk waits for it rather than start and be stopped."""
    ran = []
    e = fake_engine(policy, patience_s=0.8)  # a usual chunk: 800 ms; a quarter of it: 200 ms
    sched = Scheduler(e)
    teach(e.pace, clock, 0.5, 8)
    e.pace.typed()
    sched.add_background(lambda engine, stop: ran.append(clock()), key="bg")
    clock.advance(0.375)  # the request is due in 125 ms
    sched._background_step()
    assert not ran and sched.idle_at == pytest.approx(clock() + 0.125 + 0.03)  # and slack_s
    assert sched.held_at == clock()
    e.pace.requested()  # it came: nothing is due now
    clock.advance(0.01)
    sched._background_step()
    assert ran == [clock()] and e.on == [True, False]  # (interruptible while it ran)


def test_idle_work_goes_on_when_the_due_request_leaves_time_for_a_chunk(clock, policy):
    ran = []
    e = fake_engine(policy, patience_s=0.8)
    sched = Scheduler(e)
    teach(e.pace, clock, 0.5, 8)
    e.pace.typed()
    sched.add_background(lambda engine, stop: ran.append(clock()), key="bg")
    clock.advance(0.25)  # the request is due in 250 ms: more than a quarter of a usual chunk
    sched._background_step()
    assert ran == [clock()] and sched.held_at is None


def test_a_keystrokes_answer_goes_first_and_never_holds_for_the_request_it_is_for(clock, policy):
    """An answer begun at a keystroke (``for_request``) is the due request's own work: where other idle
    work holds for that request (the test above), it runs; it stops a started task's batch and goes
    before it (that task goes on after it); stopped, when the request takes it over, it is not begun
    again."""
    log = []

    def work(name, n):
        def fn(engine, stop):
            def steps():
                for _ in range(n):
                    log.append(name)
                    yield
            return steps()
        return fn

    e = fake_engine(policy, patience_s=0.8)  # a quarter of a usual chunk: 200 ms
    sched = Scheduler(e)
    teach(e.pace, clock, 0.5, 8)
    sched.add_background(work("grow", 100), key="grow")
    sched._background_step()
    e.pace.typed()
    clock.advance(0.375)  # the request is due in 125 ms: growth holds
    sched._background_step()
    assert log == ["grow"] and sched.held_at == clock()
    sched.add_background(work("answer", 100), key="keystroke", first=True, for_request=True)
    assert e.interrupted == 1  # growth's batch in progress stops
    sched._background_step()
    sched._background_step()
    assert log == ["grow", "answer", "answer"]
    sched._close_background()  # the request came: it takes the answer over
    assert [t.key for t in sched.background.waiting] == ["grow"]
    e.pace.requested()
    sched._background_step()
    assert log[-1] == "grow"


def test_the_scheduler_times_its_work_by_the_policys_clock(clock, policy):
    e = fake_engine(policy)
    sched = Scheduler(e)
    sched.add_background(lambda engine, stop: clock.advance(0.25), key=("grow", "a.py"))
    sched._background_step()
    assert sched.spent == {"idle_grow": 0.25}


def test_each_tick_takes_the_work_of_highest_priority(clock, policy):
    """The loop's order, one ``tick`` at a time on a fake engine (a request's steps are a script):
    a call first; a waiting request starts between two tokens of a running one; generation takes
    turns; a superseded request ends before the request that superseded it starts; background work
    only once no request runs, after the grace; a save after the quiet."""
    log: list = []

    def script(name, steps, should_stop):
        def gen():
            for kind in steps:
                if should_stop():
                    raise Cancelled()  # (as a request's steps do between two tokens)
                log.append(f"{name}:{kind}")
                yield kind
            return name
        return gen()

    e = fake_engine(policy, slots=SimpleNamespace(slots=[object(), object()], free=lambda: []),
                    flush=lambda: log.append("save"), growth=SimpleNamespace(patience_s=0.05), reduced=lambda path: False,
                    config=SimpleNamespace(grow_share=0.0, grow_window_ms=0, idle_chunk_ms=50,
                                           idle_chunk_tokens=64, max_tokens=8))
    scripts = {"a": ["prefill", "shown", "shown"], "b": ["prefill", "shown", "shown", "shown"], "c": ["shown"]}
    e.runner = SimpleNamespace(complete_steps=lambda req, ro: script(req.path, scripts[req.path], ro.should_stop))
    sched = Scheduler(e)
    done: dict = {}

    def submit(path, key=None):
        task = RequestTask(key or path, SimpleNamespace(path=path), queued_at=clock())
        task.future.add_done_callback(lambda f: done.setdefault(path, f.exception() or f.result()))
        sched.submit(task)
        return task

    submit("a")
    sched.post(lambda engine: log.append("call"))
    sched.add_background(lambda engine, stop: log.append("background"), key="bg")
    sched.tick()
    assert log == ["call"]
    sched.tick(), sched.tick()
    assert log[1:] == ["a:prefill", "a:shown"]
    submit("b")
    sched.tick()  # b starts between two of a's tokens (a slot has no request running in it)
    assert log[-1] == "b:prefill"
    for _ in range(3):
        sched.tick()  # generation takes turns, a prefill went on first
    assert log[-3:] == ["b:shown", "a:shown", "b:shown"]
    sched.tick()  # a ends
    assert done == {"a": "a"}
    submit("c", key="b")  # supersedes b, which is running: b ends first, then c starts
    sched.tick()
    assert isinstance(done["b"], Cancelled) and log[-1] == "b:shown"  # (its step stopped it)
    sched.tick()
    assert log[-1] == "c:shown"
    sched.tick()
    assert done["c"] == "c" and sched.running == [] and "background" not in log
    clock.advance(policy.idle_grace)
    sched.tick()  # the grace is over: background work
    assert log[-1] == "background"
    clock.advance(policy.save_delay)
    sched.tick()  # the quiet is over: the slots are saved
    assert log[-1] == "save"
    sched.stop()
    assert sched.tick() is False


# -- interrupts -------------------------------------------------------------------------------------
def interrupt(e, used: int, full: int, span=None) -> tuple[bool, bool]:
    """Engine.interrupt on a fake engine: (the batch stops now, the next one stops at once)."""
    stopped, asked = [], []
    e.last_context = (used, full)
    e.decoder = SimpleNamespace(batch_span=span, ask_stop_next=lambda: asked.append(True))
    e.ctx = SimpleNamespace(interrupt=lambda: stopped.append(True))
    Engine.interrupt(e)
    return bool(stopped), bool(asked)


def test_a_request_lets_a_starved_answers_growth_finish_its_batch(clock, policy):
    e = fake_engine(policy, patience_s=1.0)
    assert interrupt(e, 1023, 3000) == (False, True)  # under starved (1024): finish it, stop the next
    assert interrupt(e, 1024, 3000) == (True, False)
    assert interrupt(e, 100, 100) == (True, False)  # the whole plan: nothing to grow
    now = clock()
    assert interrupt(e, 2000, 3000, (now - 0.125, now + 0.25)) == (True, False)  # early in the batch
    assert interrupt(e, 2000, 3000, (now - 0.25, now + 0.125)) == (False, True)  # late: it finishes
    assert interrupt(e, 100, 3000, (now - 0.125, now + 0.25)) == (False, True)  # starved: within patience_s
    assert e.active_at == 0.0  # it only asks: the engine thread notes the time of the work it takes


# -- the near window's size ------------------------------------------------------------------------------
EIGHTH = 3200 // 8 + 3200 // 8 // 3  # tokens of an eighth's near plan on a room of 3,200 (its prefix, a third more)


@dataclass
class RoomOnly:
    """A planner's room and near share (the engine sizes it by a copy: ``dataclasses.replace``)."""

    room: int
    near: int = 8

    def space(self, reserve: int) -> int:
        return self.room


def sizer(policy: Policy, space: int = 3200) -> SimpleNamespace:
    """What Engine.size_near reads: the planner's room and near share, the speed, the policy."""
    return SimpleNamespace(policy=policy, backend=Local(None), _near_sized_at=None,
                           config=SimpleNamespace(max_tokens=8), planner=RoomOnly(space))


def test_the_near_window_shrinks_at_once_and_grows_back_after_near_resize_s(clock, policy):
    e = sizer(policy)
    slow = 7500 / EIGHTH  # ms a token: an eighth's plan takes 7.5 s (over near_max_ms, 5 s), a sixteenth's 3.75 s
    e.speed = PrefillSpeed.fixed(slow)
    Engine.size_near(e)
    assert e.planner.near == 16
    e.speed = PrefillSpeed.fixed(1.0)  # fast again: an eighth in half a second
    clock.advance(29.875)
    Engine.size_near(e)
    assert e.planner.near == 16  # less than near_resize_s (30 s) after the last change
    clock.advance(0.125)
    Engine.size_near(e)
    assert e.planner.near == 8
    e.speed = PrefillSpeed.fixed(slow * 8)
    Engine.size_near(e)
    assert e.planner.near == 0  # slower: at once, however soon (none fits in time)


def test_the_near_window_grows_back_only_with_room_to_spare(clock, policy):
    e = sizer(policy)
    e.speed = PrefillSpeed.fixed(7500 / EIGHTH)
    Engine.size_near(e)
    assert e.planner.near == 16
    e.speed = PrefillSpeed.fixed(4500 / EIGHTH)  # an eighth fits 5 s, not near_regrow (0.75) of it
    clock.advance(300)
    Engine.size_near(e)
    assert e.planner.near == 16
    e.speed = PrefillSpeed.fixed(3500 / EIGHTH)
    Engine.size_near(e)
    assert e.planner.near == 8


# -- growth's stages and a keystroke taking them ----------------------------------------------------
def test_growth_stages_are_an_eighth_of_the_context_at_least_stage_min():
    planner = SimpleNamespace(markers=SimpleNamespace(order="psm", suf=(2,)), head_tokens=lambda prefix: (1, *prefix))
    full = SimpleNamespace(prefix_tokens=tuple(range(100)), suffix_tokens=tuple(range(1600)), full_context=1700)
    body = 1 + 100 + 1  # where the suffix starts
    policy = Policy()
    assert stage_ends(planner, full, policy) == [body + 212 * k for k in range(1, 8)]  # 1700 // stages (8)
    small = replace(policy, stages=64)  # stages of 26 tokens would be too small: stage_min (64) each
    assert stage_ends(planner, full, small)[:3] == [body + 64, body + 128, body + 192]
    assert stage_ends(planner, full, policy, first=40)[0] == body + 40  # a reduced plan's suffix first


# -- the learned speed --------------------------------------------------------------------------------
def test_the_speed_learns_from_prefills_of_speed_min_tokens_and_forgets_by_speed_decay():
    s = PrefillSpeed(policy=Policy())
    s.observe(7, 0, 100.0)
    assert not s.known  # under speed_min_tokens (8): too small to say anything
    s.observe(8, 0, 16.0)
    assert s.a == 2.0
    s.observe(100, 0, 400.0)  # the sums of the fit: the old observation weighs speed_decay (0.95)
    assert s.s11 == pytest.approx(0.95 * 8 ** 2 + 100 ** 2) and s.s1y == pytest.approx(0.95 * 8 * 16 + 100 * 400)


# -- drafts ---------------------------------------------------------------------------------------------
def test_drafting_pauses_when_few_drafts_are_taken():
    stats = drafts.DraftStats(Policy())
    prompt = np.arange(100, dtype=np.int32)
    d = drafts.Drafter(prompt, prompt[:0], [], 8, stats)
    stats.plain(0.01)  # a plain decode's cost is known
    assert d.propose([10, 11, 12]) == [13, 14, 15, 16]  # k starts at 4
    d.taken(20, 4, 0)  # none of 4 taken: the smoothed rate 0.5 -> 0.35 (draft_smooth 0.3)
    assert d.paused_until == 0
    d.taken(21, 4, 0)  # 0.245: under draft_low_accept (0.25)
    assert d.paused_until == 21 + 16 and stats.rate == 0.25  # draft_pause
    assert d.propose(list(range(10, 10 + 36))) == []
    assert d.propose(list(range(10, 10 + 37))) == [47]  # probes again (k: what was taken, plus one)
    assert d.propose(list(range(10, 10 + 48))) == []  # draft_plain_every (48): a plain decode keeps its cost known


def test_drafts_are_at_most_max_draft_with_every_core_free_and_half_that_without():
    free = [2]
    dec = SimpleNamespace(drafting=True, policy=Policy(), free_cores=lambda: (free[0], 2),
                          draft_stats=drafts.DraftStats(Policy()))
    greedy = SimpleNamespace(params=SimpleNamespace(temperature=0.0))
    prompt = np.arange(10, dtype=np.int32)
    assert Decoder.drafter(dec, prompt, prompt[:0], greedy).cap == 8
    free[0] = 1
    assert Decoder.drafter(dec, prompt, prompt[:0], greedy).cap == 4


# -- free cores -----------------------------------------------------------------------------------------
def test_other_processes_take_a_core_from_cores_taken_and_it_comes_back_after_cores_rise_windows():
    cores = FreeCores(policy=Policy())
    cores.cores = cores.free = 4
    cores._set(0.74)  # an editor, a client: under cores_taken (0.75) of a core
    assert cores.free == 4
    cores._set(0.75)
    assert cores.free == 3  # at once
    cores._set(0.0)
    assert cores.free == 3  # one window: noise, maybe
    cores._set(0.0)
    assert cores.free == 4  # cores_rise (2) windows in a row
