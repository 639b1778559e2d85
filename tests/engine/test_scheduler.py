"""The scheduler: a waiting request goes first, generation takes turns, background work yields within
one step and goes on later; answers of interleaved requests equal their plans computed cold."""

import threading
import time

import pytest

from efim_local.engine import CompletionRequest, Engine
from efim_local.engine.steps import Steps, drive
from efim_local.engine.scheduler import Scheduler
from efim_local.engine.tasks import RequestTask
from efim_local.errors import Busy, Cancelled, InternalError

from tests.helpers import small_config, sources, wait_until

TIMEOUT = 120


@pytest.fixture(scope="module")
def engine(tiny_model):
    with Engine(small_config(n_ctx_seq=2048), tiny_model) as e:
        yield e


@pytest.fixture(scope="module")
def reference(tiny_model):
    with Engine(small_config(n_ctx_seq=2048, n_slots=1), tiny_model) as e:
        yield e


@pytest.fixture
def scheduler(engine):
    engine.clear_slots()
    s = Scheduler(engine)
    t = threading.Thread(target=s.run, daemon=True)
    t.start()
    yield s
    s.stop()
    t.join(TIMEOUT)
    assert not t.is_alive()


class Recorder:
    """Events in the order the engine thread produced them, and each request's outcome."""

    def __init__(self):
        self.events, self.results, self.cond = [], {}, threading.Condition()

    def task(self, name, req, on_first_text=None, key=None):
        def on_text(text):
            if on_first_text is not None and not any(e == (name, "text") for e in self.events):
                on_first_text()
            self.events.append((name, "text"))

        def done(fut):  # (on the engine thread, as the daemon's reply)
            err = fut.exception()
            with self.cond:
                self.events.append((name, "done"))
                self.results[name] = (None if err else fut.result(), err)
                self.cond.notify_all()

        task = RequestTask(key or name, req, on_text)
        task.future.add_done_callback(done)
        return task

    def wait(self, *names):
        with self.cond:
            assert self.cond.wait_for(lambda: all(n in self.results for n in names), TIMEOUT), self.results


def request(i, cursor_at, max_tokens, path=None):
    text = sources()[i][:3000]
    cur = text.index("\n", cursor_at) + 1
    return CompletionRequest(text, cur, path=path or f"sched-{i}.py", layout="efim", max_tokens=max_tokens,
                             ignore_eog=True)


def cold(reference, engine, req, out):
    plan = engine.plan(req)  # the anchor is the file's own: the same plan again
    want = reference.run(plan.tokens, req.how, cold=True)
    assert out.token_ids == want.token_ids


def test_a_waiting_request_starts_between_the_tokens_of_another(scheduler, engine, reference):
    """B comes while A generates: B's prefill runs before A's next token, and with generation taking
    turns B (8 tokens) ends long before A (48). Both answers equal their plans computed cold."""
    rec = Recorder()
    a, b = request(0, 1500, 48), request(1, 1500, 8)
    scheduler.submit(rec.task("A", a, on_first_text=lambda: scheduler.submit(rec.task("B", b))))
    rec.wait("A", "B")
    assert rec.events.index(("B", "done")) < rec.events.index(("A", "done"))
    # A went on generating while B ran: its texts come on both sides of B's end.
    b_done = rec.events.index(("B", "done"))
    assert ("A", "text") in rec.events[b_done:] and rec.events[:b_done].count(("A", "text")) < 40
    (out_a, err_a), (out_b, err_b) = rec.results["A"], rec.results["B"]
    assert err_a is None and err_b is None
    cold(reference, engine, a, out_a)
    cold(reference, engine, b, out_b)
    assert not engine.slots.busy


def test_each_slot_says_what_runs_in_it(scheduler, engine):
    """A slot's job and phase, as the engine thread sees them between two steps: a request's while it
    generates (no other work picks its slot), idle work's while it prefills, none after either ends;
    and whose file it is, from the work's first step (status shows it)."""
    seen = []
    states = lambda: sorted((s.job, s.phase, s.path) for s in engine.slots.slots if s.job is not None)
    rec = Recorder()  # (a file no slot served yet: a slot that served it would name it anyway)
    scheduler.submit(rec.task("A", request(0, 1500, 4, path="sched-states.py"), on_first_text=lambda: seen.append(states())))
    rec.wait("A")
    assert seen == [[("request", "generate", "sched-states.py")]] and rec.results["A"][1] is None
    assert not engine.slots.busy and states() == []
    text = sources()[2][:2000]

    def stop():  # polled between two of the warm's prompt batches
        seen.append(states())
        return False

    drive(engine.growth.top_steps("sched-top.py", text, stop))
    assert seen[1:] and all(s == [("warm", "prefill", "sched-top.py")] for s in seen[1:]), seen
    assert states() == []


def test_the_engine_queues_a_requests_follow_up_work(engine):
    """Built with ``follow_up`` (as the daemon's), the scheduler itself queues what a request leaves
    behind: the answer's greedy continuation, and growth when the budget reduced the plan; a request
    cancelled by a keystroke leaves its continuation too (the keys mostly type it), one that failed
    none. (The daemon queued these itself before.)"""
    engine.clear_slots()
    s = Scheduler(engine, follow_up=True)
    queued = []
    s.add_background = lambda fn, key=None, path=None, first=False: queued.append(key)
    old, engine.growth.reduced = engine.growth.reduced, lambda path: path == "sched-follow-0.py"
    try:
        for path, err in (("sched-follow-0.py", None), ("sched-follow-1.py", Cancelled()),
                          ("sched-follow-2.py", ValueError("bad"))):
            req = CompletionRequest("def f(x):\n    return ", 21, path=path, max_tokens=4)  # greedy
            task = RequestTask(path, req)
            s._end(task, None, err)
    finally:
        engine.growth.reduced = old
    assert queued == [("ahead", "sched-follow-0.py"), ("grow", "sched-follow-0.py"), ("ahead", "sched-follow-1.py")]


def test_submit_returns_a_future_of_the_completion_and_a_superseded_one_raises_cancelled(scheduler, engine,
                                                                                       reference):
    """``submit`` returns the request's future: it resolves to the Completion (callbacks added before
    run on the engine thread, as the daemon's reply); a running request superseded by a keystroke
    raises Cancelled, and a queued one raises it at once, in the thread that superseded it."""
    main, on_engine, later = threading.current_thread(), [], []
    b = request(1, 1500, 8)
    # the keystroke comes while the first request streams (the tiny model would end it first)
    first = RequestTask("doc", request(3, 1200, 48),
                        on_text=lambda text: later or later.append(scheduler.submit(RequestTask("doc", b))))
    first.future.add_done_callback(lambda fut: on_engine.append(threading.current_thread() is not main))
    fut_a = scheduler.submit(first)
    assert fut_a is first.future
    with pytest.raises(Cancelled):
        fut_a.result(TIMEOUT)
    cold(reference, engine, b, later[0].result(TIMEOUT))
    assert on_engine == [True]
    # queued (a call holds the engine thread): superseded in the caller's thread, at once
    gate = threading.Event()
    scheduler.post(lambda engine: gate.wait(TIMEOUT))
    queued = scheduler.submit(RequestTask("doc", b))
    newer = scheduler.submit(RequestTask("doc", b))
    assert queued.done() and isinstance(queued.exception(), Cancelled) and "superseded" in str(queued.exception())
    gate.set()
    cold(reference, engine, b, newer.result(TIMEOUT))


def test_the_requests_a_dead_engine_thread_ran_raise_the_given_error(engine):
    """``orphans(err)``: the started requests are taken away and their futures raise ``err`` (the
    daemon's reply: its engine thread died), a queued one stays for the next thread."""
    engine.clear_slots()
    s = Scheduler(engine)
    running, queued = RequestTask("a", request(0, 800, 4)), RequestTask("b", request(1, 800, 4))
    s.running.append(running)
    s.submit(queued)
    err = InternalError("internal error: the engine thread failed; restarted")
    assert s.orphans(err) == [running] and not s.running
    assert running.future.exception() is err and not queued.future.done() and s.queued() == 1


def test_a_superseded_request_is_cancelled(scheduler):
    rec = Recorder()
    a = request(2, 1000, 48)
    scheduler.submit(rec.task("A", a, key="doc", on_first_text=lambda: scheduler.submit(rec.task("A2", a, key="doc"))))
    rec.wait("A", "A2")
    out, err = rec.results["A"]
    assert out is None and isinstance(err, Cancelled)
    assert rec.results["A2"][1] is None


def test_background_work_yields_within_one_step_and_goes_on_later(scheduler, engine):
    """A request that comes during a background task runs before the task's next step; the task is
    closed (Cancelled at its yield), queued again and run to its end afterwards."""
    rec = Recorder()
    log, started = [], threading.Event()

    def task(engine, should_stop):
        run = len([e for e in log if e == "start"])
        log.append("start")
        try:
            for i in range(6):
                log.append(("step", run, i))
                if run == 0 and i == 2:
                    scheduler.submit(rec.task("R", request(3, 800, 4)))
                yield "prefill"
        except Cancelled:
            log.append(("closed", run, i))
            raise
        log.append("finished")
        started.set()

    scheduler.add_background(task, key="bg")
    rec.wait("R")
    assert started.wait(TIMEOUT)
    # The request came while step 2 ran: step 3 never ran before the task was closed.
    assert log[:5] == ["start", ("step", 0, 0), ("step", 0, 1), ("step", 0, 2), ("closed", 0, 2)]
    assert log[5] == "start" and log[-1] == "finished"
    assert rec.results["R"][1] is None
    assert scheduler.pending_background() == 0


def test_a_status_call_runs_between_background_steps_without_closing_the_task(scheduler, engine):
    """A light call (status: it only reads) is answered between two steps of a background task, which
    goes on where it was: a status bar polling every half second stopped the open file's warm each
    time (issue 39). A call that changes the engine still closes the task first."""
    log, finished = [], threading.Event()

    def ask(name, light):  # each call's function logs on the engine thread, where it runs
        threading.Thread(target=lambda: scheduler.call(lambda e: log.append(name), light=light)).start()
        wait_until(lambda: scheduler.calls, TIMEOUT)  # queued while the task's step still runs

    def task(engine, should_stop):
        first = not log
        log.append("start")
        try:
            for i in range(6):
                log.append(("step", i))
                if first and i == 2:
                    ask("light", True)
                if first and i == 4:
                    ask("heavy", False)
                log.append(("stop?", should_stop()))
                yield "prefill"
        except Cancelled:
            log.append(("closed", i))
            raise
        log.append("finished")
        finished.set()

    scheduler.add_background(task, key="bg")
    assert finished.wait(TIMEOUT)
    steps = lambda a, b, stop=False: [x for i in range(a, b) for x in (("step", i), ("stop?", stop))]
    assert log[:16] == ["start", *steps(0, 3), "light", *steps(3, 4), ("step", 4), ("stop?", True), ("closed", 4),
                        "heavy", "start", ("step", 0)], log
    assert log[-1] == "finished"


def test_background_work_waits_for_a_request_that_is_due(scheduler, engine):
    """A keystroke came and the editor's debounce (learned: 500 ms here) ends before a quarter of a
    usual idle batch would: the request it will send would stop the batch, so idle work waits for it
    and starts after it, or when it did not come within a little slack."""
    import time

    from tests.helpers import taught

    rec, ran, req = Recorder(), [], request(3, 800, 2)
    run = lambda e, stop: ran.append((time.perf_counter(), "R" in rec.results))
    old, patience = engine.pace, engine.growth.patience_s
    engine.pace = taught(0.5, time.perf_counter())
    try:
        engine.growth.patience_s = 0.8  # a usual idle batch takes 800 ms: idle work holds 200 ms before a request
        key = time.perf_counter()
        engine.pace.typed(key)
        time.sleep(0.35)
        scheduler.add_background(run, key="bg")
        time.sleep(0.1)
        assert not ran  # held
        scheduler.submit(rec.task("R", req))
        engine.pace.requested()
        rec.wait("R")
        assert rec.results["R"][1] is None
        wait_until(lambda: ran, TIMEOUT, "the held background task")
        assert ran[0][1], "the background task ran before the request it waited for"
        # A keystroke whose request never comes holds idle work for the debounce and the slack only.
        ran.clear()
        key = time.perf_counter()
        engine.pace.typed(key)
        time.sleep(0.35)
        scheduler.add_background(run, key="bg2")
        wait_until(lambda: ran, TIMEOUT, "the held background task")
        assert key + 0.5 <= ran[0][0] < key + 0.5 + engine.policy.slack_s + 0.3
    finally:
        engine.pace, engine.growth.patience_s = old, patience


def test_background_work_for_the_latest_request_goes_first(scheduler, engine):
    rec = Recorder()
    order, gate, both = [], threading.Event(), threading.Event()

    def work(name):
        def fn(engine, should_stop):
            order.append(name)
            if len(order) == 2:
                both.set()
        return fn

    # Hold the engine thread in a call while the queue fills, so the order is the scheduler's choice.
    held = threading.Thread(target=lambda: scheduler.call(lambda e: gate.wait(TIMEOUT), timeout=TIMEOUT))
    held.start()
    scheduler.add_background(work("other"), key="o", path="other.py")
    req = request(0, 500, 2)
    scheduler.add_background(work("latest"), key="l", path=req.path)
    scheduler.submit(rec.task("R", req))
    gate.set()
    held.join(TIMEOUT)
    rec.wait("R")
    assert both.wait(TIMEOUT)
    assert order == ["latest", "other"]


def test_a_request_stops_a_background_prompt_batch_inside_it(scheduler, engine, reference):
    """A request that comes while a background prompt batch decodes stops it between two graph
    nodes (not at its end): the batch's KV is dropped, the batches before it stay, the task goes on
    later, and the answers equal their plans computed cold. (The request is submitted inside a
    step, right before a batch whose polls ignore it: so the batch is sure to be running when the
    request comes, as when a keystroke lands in the middle of one.)"""
    from efim_local.errors import Interrupted

    rec = Recorder()
    seen, finished = [], threading.Event()
    bg = request(4, 2500, 0)
    req = request(5, 800, 4)

    def task(engine, should_stop):
        steps = Steps(engine.growth.prefill_steps(bg.path, bg.text, bg.cursor, lambda: False))
        n = 0
        try:
            while True:
                if n == 2 and not seen:
                    scheduler.submit(rec.task("R", req))
                try:
                    kind = next(steps)
                except StopIteration:
                    break
                n += 1
                yield kind
        except Interrupted:
            seen.append(n)
            raise
        finished.set()

    engine.growth.idle_chunk = lambda n_ctx: 256
    try:
        scheduler.add_background(task, key="bg", path=bg.path)
        rec.wait("R")
        assert finished.wait(TIMEOUT)
    finally:
        del engine.growth.idle_chunk  # (the method again)
    assert seen == [2], "the batch running when the request came must stop"
    assert "interrupted" in scheduler.spent  # the status's engine_time_s says what was lost
    assert rec.results["R"][1] is None
    cold(reference, engine, req, rec.results["R"][0])
    again = CompletionRequest(bg.text, bg.cursor, path=bg.path, layout="efim", max_tokens=8, ignore_eog=True)
    out = engine.complete(again)
    assert out.tokens.evaluated <= 2  # the task went on after the request and finished the plan
    cold(reference, engine, again, out)


def test_more_requests_than_slots_wait_for_a_slot(scheduler, engine, reference):
    """Five files at once on three slots: the fourth and fifth wait in the queue until a running request
    ends (its slot is free again), rather than failing; every answer equals its plan computed cold."""
    rec = Recorder()
    n = len(engine.slots.slots) + 2
    reqs = {f"R{i}": request(i % len(sources()), 800 + 40 * i, 16, path=f"many-R{i}.py") for i in range(n)}
    for name, req in reqs.items():
        scheduler.submit(rec.task(name, req))
    rec.wait(*reqs)
    for name, req in reqs.items():
        out, err = rec.results[name]
        assert err is None, f"{name}: {err!r}"
        cold(reference, engine, req, out)
    # the last two started only after a running one had ended: none of their text came before a "done"
    first_done = min(rec.events.index((k, "done")) for k in reqs)
    assert all((k, "text") not in rec.events[:first_done] for k in list(reqs)[-2:])
    assert not engine.slots.busy


def _fill_slots(scheduler, engine, rec, max_tokens=600):
    """A long answer running in every slot (returned once all of them run); cancel them with _end_all."""
    reqs = [request(i, 800 + 40 * i, max_tokens, path=f"long-{i}.py") for i in range(len(engine.slots.slots))]
    for i, r in enumerate(reqs):
        task = rec.task(f"L{i}", r)
        shown = task.on_text  # the tiny model answers 600 tokens in 50 ms: a slow reader keeps them running
        task.on_text = lambda text, shown=shown: (time.sleep(0.005), shown(text))
        scheduler.submit(task)
    wait_until(lambda: len(scheduler.running) == len(reqs) and not scheduler.waiting, TIMEOUT,
               "a request running in every slot")
    return reqs


def _end_all(scheduler, rec, names):
    for name in names:
        scheduler.cancel(lambda t, name=name: t.key == name)
    rec.wait(*names)


def test_a_request_waiting_for_a_slot_is_busy_after_its_max_wait(scheduler, engine):
    """Every slot runs a long answer: a request that waits longer than its ``max_wait`` is answered
    "busy" then, not when a slot frees seconds later (a reviewer measured 14 s for a 0.05 s limit)."""
    rec, names = Recorder(), [f"L{i}" for i in range(len(engine.slots.slots))]
    _fill_slots(scheduler, engine, rec)
    task = rec.task("late", request(0, 900, 4))
    task.max_wait = 0.05
    scheduler.submit(task)
    rec.wait("late")
    assert isinstance(rec.results["late"][1], Busy) and "for a slot" in str(rec.results["late"][1])
    assert not any(n in rec.results for n in names)  # all still running
    _end_all(scheduler, rec, names)


def test_a_keystroke_that_supersedes_a_running_request_takes_its_slot_back(scheduler, engine):
    """Slots full, another file's request waiting: a keystroke in a running request's file supersedes it
    and starts first, in its slot, on its KV (it went to the other file, which evicted it)."""
    rec, names = Recorder(), [f"L{i}" for i in range(len(engine.slots.slots))]
    _fill_slots(scheduler, engine, rec)
    scheduler.submit(rec.task("W", request(1, 1200, 8)))
    scheduler.submit(rec.task("K", request(0, 800, 8, path="long-0.py"), key="L0"))  # L0's text, its file
    rec.wait("K", "L0")
    out, err = rec.results["K"]
    assert err is None and isinstance(rec.results["L0"][1], Cancelled)
    assert out.tokens.cached >= out.tokens.prompt - 1, out.tokens  # the superseded request's KV
    assert "W" not in rec.results  # (it waits for a slot)
    _end_all(scheduler, rec, names[1:])
    rec.wait("W")
    assert rec.results["W"][1] is None
