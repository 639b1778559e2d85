"""The user's pace (engine/pace.py): the editor's debounce is learned from keystrokes and the requests
after them; right after a keystroke idle work knows how long no request can come."""

import pytest

from efim_local.engine.pace import Pace
from efim_local.engine.policy import Policy

POLICY = Policy()  # the defaults, which the numbers below assume (a 16-request memory, the 4th quantile)


def taught(gaps, start=100.0):
    """A Pace that saw a keystroke, then a request ``gap`` seconds later, for each gap (and the time
    after the last)."""
    p, t = Pace(POLICY), start
    for g in gaps:
        p.typed(t)
        p.requested(t + g)
        t += 1.0
    return p, t


def test_the_debounce_is_a_low_quantile_once_enough_requests_were_seen():
    p, _ = taught([0.16] * (POLICY.debounce_min_samples - 1))
    assert p.debounce_s == 0  # too few to guess
    p, _ = taught([0.17, 0.15, 0.2, 0.16, 0.3])
    assert p.debounce_s == pytest.approx(0.16)  # the second smallest of 5
    # An accepted suggestion's next request comes at once: one such among 16 does not turn it off
    p, _ = taught([0.15] * 15 + [0.002])
    assert p.debounce_s == pytest.approx(0.15)


def test_a_window_opens_at_each_keystroke_and_closes_after_the_debounce():
    p, t = taught([0.15] * 5)
    assert p.window_s(t) == 0  # no keystroke since the last request: a request may come any moment
    p.typed(t)
    assert p.window_s(t + 0.05) == pytest.approx(0.10)
    p.typed(t + 0.12)  # typed on: the window starts again
    assert p.window_s(t + 0.2) == pytest.approx(0.07)
    assert p.window_s(t + 0.3) == 0


def test_an_editor_that_asks_at_once_teaches_no_window():
    p, t = taught([0.0, 0.001, 0.0, 0.002])
    p.typed(t)
    assert p.window_s(t) <= 0.002
    assert p.hold_s(0.05, t) == 0  # nor a wait


def test_requests_long_after_a_keystroke_are_no_samples():
    """A request 5 s after the last keystroke (the cursor moved, the user asked by hand) says nothing
    about the debounce."""
    p, t = taught([0.15] * 4)
    p.typed(t)
    p.requested(t + 5.0)
    assert p.debounce_s == pytest.approx(0.15) and len(p.gaps) == 4


def test_idle_work_holds_when_a_request_is_due_before_a_batch_would_end():
    p, t = taught([0.15] * 5)
    p.typed(t)
    assert p.hold_s(0.05, t + 0.02) == 0  # 130 ms left: a 50 ms batch fits
    assert p.hold_s(0.05, t + 0.12) == pytest.approx(0.03 + POLICY.slack_s)  # 30 ms left: wait for the request
    assert p.hold_s(0.05, t + 0.15 + POLICY.slack_s + 0.001) == 0  # it did not come: go on
    p.requested(t + 0.16)
    assert p.hold_s(0.05, t + 0.17) == 0  # it came: nothing is due until the next keystroke


def test_keystrokes_that_bring_no_request_stop_the_waiting():
    """Typing where no completion is asked (another client, a buffer the plugin ignores): after a few
    keystrokes whose debounce passed without a request, idle work no longer waits for one."""
    p, t = taught([0.15] * 5)
    for k in range(POLICY.max_misses):
        p.typed(t + k)
        assert p.hold_s(0.05, t + k + 0.13) > 0
    p.typed(t + POLICY.max_misses)
    assert p.hold_s(0.05, t + POLICY.max_misses + 0.13) == 0
    p.requested(t + POLICY.max_misses + 0.15)
    p.typed(t + POLICY.max_misses + 1)
    assert p.hold_s(0.05, t + POLICY.max_misses + 1.13) > 0  # a request came: it waits again
