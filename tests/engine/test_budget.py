"""The latency budget: plans fit the budget, idle growth is exact and yields within one chunk."""

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from efim_local.engine import CompletionRequest, Engine
from efim_local.request import Options
from efim_local.engine.speed import PrefillSpeed
from efim_local.prompt import planner as planner_mod
from efim_local.errors import Cancelled
from efim_local.training.corpus import read_texts, stdlib_files

from tests.helpers import small_config, stop_after

DOCS = [t[:6000] for t in read_texts(stdlib_files(400_000)) if len(t) > 6000][:4]
MS_PER_TOKEN = 1.0  # the injected speed: 1 ms per new token, context free


@pytest.fixture(scope="module")
def engine(tiny_model):
    with Engine(small_config(n_ctx_seq=2048, idle_chunk_tokens=32), tiny_model) as e:
        yield e


@pytest.fixture(scope="module")
def reference(tiny_model):
    with Engine(small_config(n_ctx_seq=2048, n_slots=1), tiny_model) as e:
        yield e


@pytest.fixture(autouse=True)
def fixed_speed(engine):
    engine.speed = PrefillSpeed.fixed(MS_PER_TOKEN)
    engine.clear_slots()


@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=st.sampled_from(range(len(DOCS))), at=st.floats(0.05, 0.95), budget=st.sampled_from([40, 120, 400, 900]),
       layout=st.sampled_from(["efim", "fim"]))
def test_plans_never_exceed_the_budget(engine, doc, at, budget, layout):
    text = DOCS[doc]
    cur = text.index("\n", int(len(text) * at)) + 1 if "\n" in text[int(len(text) * at):] else len(text)
    path = f"budget-{doc}-{layout}.py"
    engine.forget(path)
    engine.clear_slots()  # every example starts cold (no cached head of the prefix)
    out = engine.complete(CompletionRequest(text, cur, path=path, layout=layout, max_prompt_ms=budget, max_tokens=2))
    assert out.tokens.evaluated * MS_PER_TOKEN <= budget  # cached tokens are free
    prefix, suffix = engine.planner.tokenize(text[:cur]), engine.planner.tokenize(text[cur:])
    plan = engine.plan(CompletionRequest(text, cur, path=path, layout=layout))
    if len(prefix) + len(suffix) + 3 > budget:  # it could not all fit: the nearest context is kept
        assert out.context["reduced"] and out.reanchor == "latency_budget"
        head = engine.session(path).anchor.head  # 0 here: nothing was cached
        assert head == 0 and list(plan.prefix_tokens) == prefix[len(prefix) - len(plan.prefix_tokens):]
        assert list(plan.suffix_tokens) == suffix[:len(plan.suffix_tokens)]
        assert len(plan.prefix_tokens) >= min(len(prefix), (budget - 3) // 2)  # most of it before the cursor
    else:
        assert not out.context["reduced"] and len(plan.prefix_tokens) == len(prefix)


def test_a_reduced_plan_keeps_the_cached_head_of_the_prefix(engine):
    """Cached tokens are free: what a slot holds of the file's top stays, the budget buys the tail.
    (The prefix fits the slot here: in a bigger file the same holds of its window, tests/engine/test_windows.py.)"""
    text, path = DOCS[2], "head.py"
    cur = text.index("\n", 2600) + 1
    top = text.index("\n", 1500) + 1  # a plan anchored higher up: its prefix is the file's top
    engine.complete(CompletionRequest(text, top, path="top.py", layout="efim", max_prompt_ms=0))
    out = engine.complete(CompletionRequest(text, cur, path=path, layout="efim", max_prompt_ms=150))
    anchor = engine.session(path).anchor
    prefix = engine.planner.tokenize(text[:cur])
    assert out.context["reduced"] and anchor.head >= 300 and out.tokens.evaluated <= 150
    assert out.context["head_tokens"] == anchor.head  # the reply says so (bench/context.py rebuilds the plan)
    assert out.tokens.cached >= anchor.head  # the head came from the other plan's slot
    tail = len(anchor.prefix_tokens) - anchor.head
    assert list(anchor.prefix_tokens) == prefix[:anchor.head] + prefix[len(prefix) - tail:]
    cold = engine.run(engine.plan(CompletionRequest(text, cur, path=path, layout="efim")).tokens,
                      Options(max_tokens=8), cold=True)
    assert out.token_ids == cold.token_ids  # the same plan, computed cold, answers the same


def test_keystrokes_after_a_reduced_plan_stay_cheap(engine):
    text, path = DOCS[0], "cheap.py"
    cur = text.index("\n", 3000) + 1
    first = engine.complete(CompletionRequest(text, cur, path=path, layout="efim", max_prompt_ms=200))
    assert first.context["reduced"] and first.tokens.evaluated <= 200
    for ch in "value":
        text, cur = text[:cur] + ch + text[cur:], cur + 1
        out = engine.complete(CompletionRequest(text, cur, path=path, layout="efim", max_prompt_ms=200))
        assert out.reanchor is None and out.context["reduced"] and out.tokens.evaluated <= 3


def _grow_until(engine, path: str, done, chunks: int) -> None:
    """Grow ``path`` a chunk at a time (a keystroke after each) until ``done()``, at most ``chunks``."""
    for _ in range(chunks):
        if done():
            return
        try:
            engine.grow(path, stop_after(2))
        except Cancelled:
            pass


def _key_after_growth(engine, path: str, text: str, cur: int, ch: str, polls: int, budget_ms: float, n: int):
    """Grow ``path`` a chunk or a few (until a keystroke arrives), then type ``ch`` at ``cur`` and ask
    for ``n`` tokens within ``budget_ms``: (the answer, its request)."""
    try:
        engine.grow(path, stop_after(polls))
    except Cancelled:
        pass
    req = CompletionRequest(text[:cur] + ch + text[cur:], cur + 1, path=path, layout="efim", max_prompt_ms=budget_ms,
                            max_tokens=n, heal=False, ignore_eog=True)
    return engine.complete(req), req


def test_idle_growth_yields_within_one_chunk(engine):
    text, path = DOCS[1], "yield.py"
    cur = text.index("\n", 3000) + 1
    engine.complete(CompletionRequest(text, cur, path=path, layout="efim", max_prompt_ms=100))
    before = {s.seq: len(s.tokens) for s in engine.slots.slots}
    with pytest.raises(Cancelled):
        engine.grow(path, stop_after(2))  # one chunk, then a request arrives
    grown = [len(s.tokens) - before[s.seq] for s in engine.slots.slots if len(s.tokens) > before[s.seq]]
    assert grown and max(grown) <= engine.config.idle_chunk_tokens
    assert engine.session(path).anchor.reduced  # not swapped: the full plan is not ready


@settings(max_examples=8, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=st.sampled_from(range(len(DOCS))), at=st.floats(0.3, 0.9), polls=st.integers(2, 12),
       typed=st.text("abc_ (", min_size=1, max_size=4))
def test_growth_in_idle_steps_is_exact(engine, reference, doc, at, polls, typed):
    """A plan grown in interrupted idle steps answers like the same plan computed cold."""
    text, path = DOCS[doc], f"grow-{doc}.py"
    engine.forget(path)
    cur = text.index("\n", int(len(text) * at)) + 1
    engine.complete(CompletionRequest(text, cur, path=path, layout="efim", max_prompt_ms=150, max_tokens=2))
    while True:  # idle time comes in pieces: each one is interrupted after a few chunks
        try:
            engine.grow(path, stop_after(polls))
            break
        except Cancelled:
            continue
    assert not engine.session(path).anchor.reduced
    text, cur = text[:cur] + typed + text[cur:], cur + len(typed)
    req = CompletionRequest(text, cur, path=path, layout="efim", max_tokens=6, heal=False)
    warm = engine.complete(req)
    assert not warm.context["reduced"] and warm.tokens.evaluated <= len(engine.planner.tokenize(typed)) + 2
    plan = engine.plan(req)
    assert plan.reanchor is None
    cold = reference.run(plan.tokens, Options(max_tokens=6), cold=True)
    assert warm.token_ids == cold.token_ids


@pytest.mark.parametrize("cached_top", [True, False])
def test_keystrokes_between_growth_chunks_keep_both_caches(engine, reference, cached_top):
    """Idle growth runs in a copy of the file's slot (or in another slot when they share nothing): a
    keystroke between two of its chunks still finds its own KV (it costs a token or two), and the
    growth keeps its progress, so it ends in about as many chunks as the missing context needs
    however much the user types meanwhile."""
    text, path = DOCS[2][:4000], f"interleave-{cached_top}.py"  # it all fits the context: growth starts at the top
    engine.forget(path)
    top, cur = text.index("\n", 1000) + 1, text.index("\n", 2800) + 1
    if cached_top:  # the slot holds the file's top, then the budget's tail
        engine.complete(CompletionRequest(text, top, path=path, layout="efim", max_prompt_ms=0, max_tokens=2))
    engine.complete(CompletionRequest(text, cur, path=path, layout="efim", max_prompt_ms=150, max_tokens=2))
    anchor = engine.session(path).anchor
    assert anchor.reduced and (anchor.head >= 300) == cached_top
    full = engine.planner.full_anchor(anchor)
    missing = len(engine.planner.stable_tokens("efim", full)) - anchor.head
    near = None if cached_top else engine.planner.near_anchor(full)  # a cold file: its near plan first
    assert cached_top or near is not None
    missing += len(engine.planner.stable_tokens("efim", near)) + 2 * engine.config.idle_chunk_tokens if near else 0
    chunks, cheap, adopted, typed, context = 0, 0, 0, "", 0
    while engine.session(path).anchor.reduced:
        try:
            engine.grow(path, stop_after(2))  # one chunk, then a keystroke arrives
        except Cancelled:
            pass
        chunks += 1
        # (each of growth's stages, and the first one at the prefix's end, costs a chunk more: the typed
        # text after it, and maybe its refresh)
        assert chunks <= missing // engine.config.idle_chunk_tokens + 2 * (engine.policy.stages + 1) + 3
        ch = "value_"[chunks % 6]
        text, cur, typed = text[:cur] + ch + text[cur:], cur + 1, typed + ch
        out = engine.complete(CompletionRequest(text, cur, path=path, layout="efim", max_prompt_ms=150, max_tokens=2))
        assert out.tokens.evaluated <= 150
        cheap += out.reanchor is None and out.tokens.evaluated <= 3
        if out.reanchor == "grown":  # it took the growth so far: more context, within half the budget
            assert out.tokens.evaluated <= 150 * engine.policy.adopt_share and out.context["tokens"] > context
            adopted += 1
        context = out.context["tokens"]
    assert cheap + adopted == chunks  # every other keystroke cost a token or two
    assert adopted <= engine.policy.adopt_gain + 1
    req = CompletionRequest(text, cur, path=path, layout="efim", max_tokens=6, heal=False)
    warm = engine.complete(req)
    assert not warm.context["reduced"]
    assert sum(s.path == path and len(s.tokens) > 0 for s in engine.slots.slots) == 1  # the stale copy is gone
    cold = reference.run(engine.plan(req).tokens, Options(max_tokens=6), cold=True)
    assert warm.token_ids == cold.token_ids


@settings(max_examples=8, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=st.sampled_from(range(len(DOCS))), at=st.floats(0.3, 0.9), share=st.sampled_from([0.25, 0.9]),
       typed=st.text("abc_ (", min_size=1, max_size=4))
def test_growth_during_generation_is_exact(engine, reference, doc, at, share, typed, monkeypatch):
    """While someone types, growth rides along with the completions (between their tokens, in another
    slot): each answer equals its own plan computed cold, the request's slot stays whole (the next
    keystroke computes only the typed text), and the plan is grown to full within the keystrokes its missing
    context needs."""
    engine.config = replace(engine.config, grow_share=share)
    used = []  # the plan each request answered from (the budget's, not plan()'s)
    fit = engine.runner.fit_budget
    monkeypatch.setattr(engine.runner, "fit_budget", lambda req, plan: used.append(fit(req, plan)) or used[-1])
    try:
        text, path = DOCS[doc], f"ride-{doc}.py"
        engine.forget(path)
        cur = text.index("\n", int(len(text) * at)) + 1
        anchor = None
        for i, ch in enumerate("x" + typed + "y" * 40):
            text, cur = text[:cur] + ch + text[cur:], cur + 1
            req = CompletionRequest(text, cur, path=path, layout="efim", max_prompt_ms=150, max_tokens=24,
                                    heal=False, ignore_eog=True)
            out = engine.complete(req)
            plan = used[-1]
            cold = reference.run(plan.tokens, Options(max_tokens=24, ignore_eog=True), cold=True)
            assert out.token_ids == cold.token_ids
            if i and anchor is engine.session(path).anchor and out.reanchor is None:
                assert out.tokens.cached >= plan.middle_start  # the request's own slot was left whole
            anchor = engine.session(path).anchor
            if not out.context["reduced"]:
                break
        assert not engine.session(path).anchor.reduced, "growth never finished"
    finally:
        engine.config = replace(engine.config, grow_share=0.0)


@settings(max_examples=6, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=st.sampled_from(range(len(DOCS))), at=st.floats(0.3, 0.9), polls=st.integers(2, 4),
       typed=st.text("abc_ (", min_size=1, max_size=4))
def test_keystrokes_take_the_growth_as_it_goes_exactly(engine, reference, doc, at, polls, typed, monkeypatch):
    """A kept, reduced plan takes what growth computed since (reason "grown": the grown head of the
    prefix, then the start of the suffix) instead of waiting for the whole plan; every answer, on a
    partly grown plan or not, equals its plan computed cold."""
    used = []
    fit = engine.runner.fit_budget
    monkeypatch.setattr(engine.runner, "fit_budget", lambda req, plan: used.append(fit(req, plan)) or used[-1])
    text, path = DOCS[doc], f"adopt-{doc}.py"
    engine.forget(path)
    cur = text.index("\n", int(len(text) * at)) + 1
    engine.complete(CompletionRequest(text, cur, path=path, layout="efim", max_prompt_ms=100, max_tokens=1))
    reasons, contexts = [], []
    for ch in (typed + "xyz_") * 40:
        out, req = _key_after_growth(engine, path, text, cur, ch, polls, 100, 4)
        text, cur = req.text, req.cursor
        if out.reanchor == "grown" or not out.context["reduced"]:  # (a kept plan: the tests above)
            cold = reference.run(used[-1].tokens, Options(max_tokens=4, ignore_eog=True), cold=True)
            assert out.token_ids == cold.token_ids
        reasons.append(out.reanchor)
        contexts.append(out.context["tokens"])
        if not out.context["reduced"]:
            break
    assert not engine.session(path).anchor.reduced, "growth never finished"
    assert reasons.count("grown") >= 1 + (reasons[-1] != "grown"), reasons  # taken on the way, not only at the end
    assert contexts == sorted(contexts)  # the context only grows


def reduced_once(engine, doc: int, path: str) -> tuple[str, int]:
    """``DOCS[doc]`` as ``path``, forgotten, then answered once on a plan the latency budget reduced
    (growth has work); the text and the cursor."""
    text = DOCS[doc]
    engine.forget(path)
    cur = text.index("\n", 3000) + 1
    engine.complete(CompletionRequest(text, cur, path=path, layout="efim", max_prompt_ms=100, max_tokens=1))
    return text, cur


@pytest.fixture
def riding(engine):
    """Growth rides along requests, a chunk after each token."""
    engine.config = replace(engine.config, grow_share=0.9, idle_chunk_ms=1.0)
    yield
    engine.config = replace(engine.config, grow_share=0.0, idle_chunk_ms=50.0)


def test_growth_during_generation_yields_to_a_request(engine):
    """A newer keystroke stops both the completion and the growth riding along with it: growth
    stops within one chunk, and its progress stays in its slot."""
    engine.config = replace(engine.config, grow_share=0.9)
    try:
        path = "ride-cancel.py"
        text, cur = reduced_once(engine, 1, path)
        assert engine.reduced(path)
        before = {s.seq: len(s.tokens) for s in engine.slots.slots}
        grown = lambda: [len(s.tokens) - before[s.seq] for s in engine.slots.slots if len(s.tokens) > before[s.seq]]

        with pytest.raises(Cancelled):  # a keystroke comes as soon as growth has decoded something
            engine.complete(CompletionRequest(text, cur, path=path, layout="efim", max_prompt_ms=100,
                                              max_tokens=24, ignore_eog=True), should_stop=lambda: bool(grown()))
        grown = grown()
        assert grown and max(grown) <= engine.config.idle_chunk_tokens + 1  # one chunk (and the fork's token)
        assert engine.reduced(path) and not engine.slots.busy
    finally:
        engine.config = replace(engine.config, grow_share=0.0)


def test_growth_riding_along_a_request_never_cuts_the_stage_ahead(engine, riding):
    """Growth riding along a request counts the request's own (busy) slot as holding its plan: it
    never computes that plan again in the slot where the next stage grows, so what growth holds of
    the full plan never shrinks while the user types. (It did: the paced replay's context stuck at
    the first stage, 53% of the full plan, for 40 s of typing.)"""
    import numpy as np

    path = "ride-stages.py"
    text, cur = reduced_once(engine, 1, path)
    anchor = engine.session(path).anchor
    full = np.asarray(engine.planner.stable_tokens("efim", engine.planner.full_anchor(anchor)), np.int32)
    held = lambda: engine.reuse.peek(full, busy_ok=True)
    history, reasons = [held()], []
    for ch in "value_x = (y" * 30:
        text, cur = text[:cur] + ch + text[cur:], cur + 1
        out = engine.complete(CompletionRequest(text, cur, path=path, layout="efim", max_prompt_ms=100,
                                                max_tokens=3, ignore_eog=True, heal=False))
        history.append(held())
        reasons.append(out.reanchor)
        if not out.context["reduced"]:
            break
    assert not engine.session(path).anchor.reduced, "growth never finished"
    assert reasons.count("grown") >= 2  # stages were taken on the way
    # Never cut back. (A slot's next token may match the full plan's by chance, a keystroke then
    # replaces it: the count dips by that one token, which is no growth lost; the bug cut stages.)
    dips = [(a, b) for a, b in zip(history, history[1:]) if b < a]
    assert all(a - b == 1 and a - 1 in history for a, b in dips), (dips, history)


def test_growth_riding_along_a_request_is_one_job_beside_it(engine, riding, monkeypatch):
    """Growth riding along a request is planned once for it and goes on chunk by chunk between its
    tokens, in a slot of its own: while the request's slot generates, growth's prefills (each slot
    says so), and its progress stays when the request ends."""
    path = "ride-job.py"
    text, cur = reduced_once(engine, 2, path)
    assert engine.reduced(path)
    planned, seen = [], []
    grow = engine.growth.grow_steps
    monkeypatch.setattr(engine.growth, "grow_steps", lambda *a, **k: planned.append(1) or grow(*a, **k))
    held = lambda: {s.seq: len(s.tokens) for s in engine.slots.slots}
    on_text = lambda _: seen.append((sorted((s.job, s.phase) for s in engine.slots.slots if s.job), held()))
    out = engine.complete(CompletionRequest(text, cur, path=path, layout="efim", max_prompt_ms=100,
                                            max_tokens=16, ignore_eog=True), on_text=on_text)
    assert out.context["reduced"] and len(seen) >= 8
    beside = [h for states, h in seen if states == [("grow", "prefill"), ("request", "generate")]]
    assert len(beside) >= 3, seen  # one job, many chunks between the request's tokens
    assert planned == [1]  # planned once (it was planned again at each token)
    grown = [seq for seq in beside[0] if beside[-1][seq] > beside[0][seq] and seq != out.slot]
    assert grown  # its slot grew from token to token
    assert all(s.job is None for s in engine.slots.slots)
    assert len(engine.slots.slots[grown[0]].tokens) >= beside[-1][grown[0]]  # what it computed stays


def test_a_budgeted_reanchor_tokenizes_the_file_once(engine, monkeypatch):
    text, path = DOCS[3], "once.py"
    cur = text.index("\n", 3000) + 1
    engine.forget(path)
    calls = []
    real = engine.planner.tokenize
    monkeypatch.setattr(engine.planner, "tokenize", lambda s: calls.append(len(s)) or real(s))
    out = engine.complete(CompletionRequest(text, cur, path=path, layout="efim", max_prompt_ms=100))
    assert out.context["reduced"]
    assert sum(n > 1000 for n in calls) == 2, calls  # the prefix and the suffix, once each


def test_calibration_measures_speed_and_builds_the_healer(tiny_model):
    """The daemon's start-up idle task: after it, the budget knows the speed and the first keystroke
    does not build the healer's vocabulary index; it leaves every slot empty."""
    with Engine(small_config(heal=None), tiny_model) as e:  # the model's default: healing on
        assert not e.speed.known and e.decoder._healer is None and e.default_heal
        e.calibrate()
        assert e.speed.known and e.decoder._healer is not None
        assert all(len(s.tokens) == 0 for s in e.slots.slots)


def test_growth_rides_along_only_within_its_window(engine):
    """Past ``grow_window_ms`` after the request came, the user is waiting for the answer: no growth."""
    text, path = DOCS[3], "ride-window.py"
    cur = text.index("\n", 3000) + 1
    for window, grows in ((0.0, False), (60_000.0, True)):
        engine.forget(path)
        engine.clear_slots()
        engine.config = replace(engine.config, grow_share=0.9, grow_window_ms=window)
        try:
            req = CompletionRequest(text, cur, path=path, layout="efim", max_prompt_ms=100, max_tokens=24,
                                    ignore_eog=True)
            assert engine.complete(req).context["reduced"]
            grown = [s for s in engine.slots.slots if len(s.tokens) and s.idle]  # growth's own slot
            assert bool(grown) == grows
        finally:
            engine.config = replace(engine.config, grow_share=0.0, grow_window_ms=500.0)


def test_an_interrupted_cursor_prefill_leaves_the_anchor_the_request_will_use(engine, monkeypatch):
    """The cursor prefill plans within the budget first (the anchor the next request plans), then
    grows: a keystroke that interrupts the growth finds its plan cached and does not re-anchor."""
    monkeypatch.setattr(engine, "config", replace(engine.config, max_prompt_ms=150))
    text, path = DOCS[0], "prefill.py"
    engine.forget(path)
    cur = text.index("\n", 3000) + 1
    with pytest.raises(Cancelled):
        engine.prefill(path, text, cur, stop_after(6))  # the budgeted plan, then a few growth chunks
    out = engine.complete(CompletionRequest(text, cur, path=path, layout="efim", max_tokens=2))
    assert out.reanchor is None and out.context["reduced"] and out.tokens.evaluated <= 2, out


def test_a_file_opened_without_a_cursor_warms_its_top(engine, reference):
    """Opened before any cursor is known, a file bigger than a slot is warmed from its top (the head
    of every plan on its first window), not at its end (another window): a request in the first
    window then finds its prefix cached, and its answer equals its plan computed cold."""
    from efim_local.engine.steps import drive

    text, path = "".join(DOCS), "opened.py"  # about three slots' worth
    engine.forget(path)
    engine.clear_slots()
    drive(engine.growth.top_steps(path, text))
    cur = text.index("\n", 1500) + 1
    req = CompletionRequest(text, cur, path=path, layout="efim", max_tokens=4, heal=False)
    out = engine.complete(req)
    plan = engine.plan(req)
    assert plan.prefix_trimmed == 0 and len(plan.prefix_tokens) > 300  # the first window
    assert out.tokens.cached >= len(plan.prefix_tokens) - 1  # (the anchor's line may tokenize otherwise)
    assert out.token_ids == reference.run(plan.tokens, Options(max_tokens=4), cold=True).token_ids


def test_a_plan_lacking_prefix_lines_takes_them_as_soon_as_they_are_grown(engine, reference):
    """A reduced plan that keeps the cached head and the lines nearest the cursor, but not the few
    between, takes the grown plan as soon as growth has the whole prefix (and the suffix it had) and
    the text typed since, without waiting for a stage of the suffix or for a sixteenth of the context
    (the lines between weigh most); the answer equals that plan computed cold."""
    text, path = DOCS[2][:4000], "lacking.py"
    engine.forget(path)
    top, cur = text.index("\n", 2500) + 1, text.index("\n", 2800) + 1
    engine.complete(CompletionRequest(text, top, path=path, layout="efim", max_prompt_ms=0, max_tokens=2))
    used = []
    fit = engine.runner.fit_budget

    def key(ch):  # a keystroke at the cursor, within a 40 ms budget (40 new tokens)
        nonlocal text, cur
        text, cur = text[:cur] + ch + text[cur:], cur + 1
        req = CompletionRequest(text, cur, path=path, layout="efim", max_prompt_ms=40, max_tokens=4, heal=False)
        engine.runner.fit_budget = lambda r, p: used.append(fit(r, p)) or used[-1]
        try:
            return engine.complete(req)
        finally:
            del engine.runner.fit_budget  # (the method again)

    for ch in "value = compute(alpha, beta) + offset * scale_factor":  # more than half the budget buys
        out = key(ch)
    anchor = engine.session(path).anchor
    full = engine.planner.full_anchor(anchor)
    gap = len(full.prefix_tokens) - len(anchor.prefix_tokens)
    assert anchor.reduced and 0 < anchor.head and 0 < gap < max(engine.policy.adopt_min, out.context["full_tokens"] // 16)
    assert len(used[-1].middle_tokens) > 40 * engine.policy.adopt_share
    first = engine.planner.stable_tokens("efim", full)[:len(engine.planner.head_tokens(full.prefix_tokens)) + 1
                                                       + len(anchor.suffix_tokens)]
    while engine.reuse.peek(np.asarray(first, np.int32)) < len(first):
        try:
            engine.grow(path, stop_after(2))  # a chunk at a time
        except Cancelled:
            pass
    for _ in range(3):  # growth computes the stage's typed text after it, then the keystroke takes it
        try:
            engine.grow(path, stop_after(2))
        except Cancelled:
            pass
    out = key("_")
    assert out.reanchor == "grown" and out.context["prefix_tokens"] == len(full.prefix_tokens)
    assert out.context["suffix_tokens"] < len(full.suffix_tokens)  # before any stage of the suffix
    assert out.tokens.evaluated <= 40 * engine.policy.adopt_share
    assert out.token_ids == reference.run(used[-1].tokens, Options(max_tokens=4), cold=True).token_ids


def test_a_cold_cursor_deep_in_a_file_grows_its_near_window_first(engine, reference):
    """Nothing cached and a cursor far down: growth computes the plan of the last eighth of the room
    before the cursor (the near window) before the whole window, a keystroke takes it at once, and a
    cursor moved a few lines down starts from it; every answer equals its plan computed cold."""
    text, path = DOCS[1], "near.py"
    engine.forget(path)
    cur = text.index("\n", 5200) + 1
    out = engine.complete(CompletionRequest(text, cur, path=path, layout="efim", max_prompt_ms=60, max_tokens=2))
    anchor, pl = engine.session(path).anchor, engine.planner
    assert out.context["reduced"] and anchor.head == 0 and anchor.inner > 0
    full, near = pl.full_anchor(anchor), pl.near_anchor(anchor)
    room = pl.space(8) // planner_mod.NEAR
    assert len(near.prefix_tokens) <= room + 3 * pl.window_step(room)
    assert list(near.prefix_tokens) == list(full.prefix_tokens[anchor.inner:])  # the nearest lines, whole
    peek = lambda toks: engine.reuse.peek(np.asarray(toks, np.int32))
    near_plan = pl.stable_tokens("efim", near, engine.session(path).typed)
    top = pl.head_tokens(full.prefix_tokens)
    _grow_until(engine, path, lambda: peek(near_plan) == len(near_plan),
                len(near_plan) // engine.config.idle_chunk_tokens + 8)
    assert peek(near_plan) == len(near_plan) and peek(top) < len(pl.head_tokens(())) + 64  # the window's top waits

    def key(text, cur, budget=60):
        req = CompletionRequest(text, cur, path=path, layout="efim", max_prompt_ms=budget, max_tokens=4)
        out = engine.complete(req)
        cold = reference.run(engine.plan(req).tokens, Options(max_tokens=4), cold=True)
        assert out.token_ids == cold.token_ids and out.tokens.evaluated <= budget
        return out

    text, cur = text[:cur] + "x" + text[cur:], cur + 1
    out = key(text, cur, 60)
    assert out.reanchor == "grown" and out.context["prefix_tokens"] == len(near.prefix_tokens)
    assert out.context["suffix_tokens"] == len(near.suffix_tokens)
    # Six lines down: the near window's head is cached, the budget buys the lines between and the suffix.
    down = cur
    for _ in range(6):
        down = text.index("\n", down) + 1
    out = key(text, down, 60)
    assert out.reanchor == "latency_budget" and engine.session(path).anchor.base == anchor.inner
    assert out.context["head_tokens"] >= len(near.prefix_tokens) - 8 and out.tokens.cached >= out.context["head_tokens"]


def test_a_slower_model_grows_a_smaller_near_plan_first(engine, reference):
    """The engine sizes the near window by the learned speed, again when the speed changes: where an
    eighth of the room would take more than policy.near_max_ms, a sixteenth is grown first, and a keystroke
    has it cached (answering as from the same plan computed cold); where none would fit in time,
    there is no near window."""
    text, path = DOCS[1], "near-slow.py"
    eighth = engine.planner.space(engine.config.max_tokens) // 8
    ms = engine.policy.near_max_ms / (eighth + eighth // 3) * 1.5  # an eighth: 7.5 s; a sixteenth: 3.8 s
    try:
        engine._near_sized_at = None
        # It shrinks when the speed falls, and grows back only with room to spare (a sixteenth in
        # 3/4 of the time, policy.near_resize_s after a change), so windows stay put while the speed wavers.
        for speed, share in ((ms, 16), (ms * 8, 0), (ms * 1.1, 0), (ms * 0.8, 16), (MS_PER_TOKEN, 8), (ms, 16)):
            engine.speed = PrefillSpeed.fixed(speed)
            if engine._near_sized_at is not None:
                engine._near_sized_at -= engine.policy.near_resize_s
            engine.size_near()
            assert engine.planner.near == share
        engine.speed = PrefillSpeed.fixed(MS_PER_TOKEN)
        engine.size_near()
        assert engine.planner.near == 16  # changed less than policy.near_resize_s ago: it does not grow back yet
        engine.speed = PrefillSpeed.fixed(ms * 8)
        engine.size_near()
        assert engine.planner.near == 0  # but shrinks at once
        engine.speed, engine._near_sized_at = PrefillSpeed.fixed(ms), None
        engine.size_near()
        assert engine.planner.near == 16
        engine.forget(path)
        cur = text.index("\n", 5200) + 1
        req = CompletionRequest(text, cur, path=path, layout="efim", max_prompt_ms=ms * 12, max_tokens=2)
        engine.complete(req)
        anchor = engine.session(path).anchor
        assert engine.planner.near == 16 and anchor.reduced and anchor.inner
        pl = engine.planner  # (sized: a copy with its near share)
        full = pl.full_anchor(anchor)
        near = engine.growth.near_plan(pl, path, full, anchor)
        assert near is not None and len(near.prefix_tokens) <= eighth // 2
        # A plan whose cached head from the window's top holds a few near windows grows the window.
        headed = replace(anchor, head=engine.policy.head_over_near * len(near.prefix_tokens))
        assert anchor.base == 0 and engine.growth.near_plan(pl, path, full, headed) is None
        stable = pl.stable_tokens("efim", near, engine.session(path).typed)
        peek = lambda toks: engine.reuse.peek(np.asarray(toks, np.int32))
        t0 = engine.policy.clock()
        _grow_until(engine, path, lambda: peek(stable) == len(stable), len(stable))  # small chunks at this speed
        assert peek(stable) == len(stable)
        # The file's next near plan waits as long as this one takes at the learned speed.
        took = engine.speed.predict_ms(len(stable), 0) / 1000
        assert t0 + took <= engine.files.get(path).near_until <= engine.policy.clock() + took
        text, cur = text[:cur] + "x" + text[cur:], cur + 1  # a keystroke
        req = CompletionRequest(text, cur, path=path, layout="efim", max_prompt_ms=ms * 12, max_tokens=4)
        out = engine.complete(req)
        # Taken (grown), or the budgeted re-plan starts from it: either way, the near prefix, cached.
        assert out.reanchor in ("grown", "latency_budget") and out.context["head_tokens"] >= len(near.prefix_tokens)
        assert out.tokens.evaluated <= planner_mod.MIN_CONTEXT + 8
        cold = reference.run(engine.plan(req).tokens, Options(max_tokens=4), cold=True)
        assert out.token_ids == cold.token_ids
        # A jump to a cold place right after: its near plan waits while the window has its turn (as
        # long as the last near plan took), so a cursor that jumps every few seconds still gets it.
        state = engine.files.get(path)
        far = text.index("\n", 3000) + 1
        engine.complete(CompletionRequest(text, far, path=path, layout="efim", max_prompt_ms=ms * 12, max_tokens=2))
        there = engine.session(path).anchor
        far_near = lambda: engine.growth.near_plan(pl, path, pl.full_anchor(there), there)
        state.near_until = engine.policy.clock() + 60
        assert far_near() is None
        state.near_until = 0.0
        assert far_near() is not None
        # One begun goes on, however soon.
        far_stable = pl.stable_tokens("efim", far_near())
        _grow_until(engine, path, lambda: peek(far_stable) > len(pl.head_tokens(())) + engine.policy.begun,
                    len(far_stable))
        assert len(pl.head_tokens(())) + engine.policy.begun < peek(far_stable) < len(far_stable)
        state.near_until = engine.policy.clock() + 60
        assert far_near() is not None
    finally:
        engine.speed, engine._near_sized_at = PrefillSpeed.fixed(MS_PER_TOKEN), None
        engine.size_near()


@pytest.fixture(scope="module")
def wide(tiny_model):
    """An engine with the daemon's default slot (4,096 tokens): its near window has a nearest window."""
    with Engine(small_config(n_ctx_seq=4096, n_slots=4, idle_chunk_tokens=32), tiny_model) as e:
        e.speed = PrefillSpeed.fixed(MS_PER_TOKEN)
        yield e


@pytest.fixture(scope="module")
def wide_reference(tiny_model):
    with Engine(small_config(n_ctx_seq=4096, n_slots=1), tiny_model) as e:
        yield e


def test_a_cold_cursor_grows_its_nearest_window_before_its_near_window(wide, wide_reference):
    """A cold cursor deep in a file: growth computes the plan of the nearest window (a quarter of the
    near window) first, then the near plan; a keystroke while the near plan is part of the way takes
    the nearest plan, the next one after it the near plan; every answer equals its plan computed cold."""

    engine, text, path = wide, DOCS[1], "nearest.py"
    engine.forget(path)
    engine.clear_slots()
    cur = text.index("\n", 5200) + 1
    engine.complete(CompletionRequest(text, cur, path=path, layout="efim", max_prompt_ms=40, max_tokens=2))
    anchor, pl = engine.session(path).anchor, engine.planner
    full, near = pl.full_anchor(anchor), pl.near_anchor(anchor)
    nearest = pl.near_anchor(anchor, nearest=True)
    assert anchor.reduced and anchor.inner < anchor.innermost and nearest.base == anchor.innermost
    assert list(nearest.prefix_tokens) == list(full.prefix_tokens[anchor.innermost:])  # the nearest lines, whole
    room = pl.space(8) // planner_mod.NEAR // planner_mod.NEAREST
    assert len(anchor.prefix_tokens) < len(nearest.prefix_tokens) <= room
    peek = lambda toks: engine.reuse.peek(np.asarray(toks, np.int32))
    typed = engine.session(path).typed
    nearest_plan, near_plan = (pl.stable_tokens("efim", a, typed) for a in (nearest, near))
    _grow_until(engine, path, lambda: peek(nearest_plan) == len(nearest_plan),
                len(nearest_plan) // engine.config.idle_chunk_tokens + 8)
    assert peek(nearest_plan) == len(nearest_plan)
    lead = len(pl.head_tokens(()))
    assert peek(near_plan) <= lead + engine.policy.begun  # the near plan waits
    head = list(nearest_plan[:lead + 16])
    assert sum(list(s.tokens[:lead + 16]) == head for s in engine.reuse.slots.slots) == 1  # one slot, no stages
    # The near plan grows (the nearest stays in its slot) until it holds more than the nearest window.
    _grow_until(engine, path, lambda: peek(near_plan) > lead + len(nearest.prefix_tokens) + 60, 40)
    assert lead + len(nearest.prefix_tokens) + 60 < peek(near_plan) < lead + len(near.prefix_tokens)
    assert peek(nearest_plan) == len(nearest_plan)

    def key(text, cur):
        req = CompletionRequest(text, cur, path=path, layout="efim", max_prompt_ms=40, max_tokens=4)
        out = engine.complete(req)
        cold = wide_reference.run(engine.plan(req).tokens, Options(max_tokens=4), cold=True)
        assert out.token_ids == cold.token_ids and out.tokens.evaluated <= 40
        return out

    text, cur = text[:cur] + "x" + text[cur:], cur + 1
    out = key(text, cur)
    assert out.reanchor == "grown" and out.context["prefix_tokens"] == len(nearest.prefix_tokens)
    assert engine.session(path).anchor.base == anchor.innermost
    near_plan = pl.stable_tokens("efim", near, engine.session(path).typed)
    _grow_until(engine, path, lambda: peek(near_plan) == len(near_plan),
                len(near_plan) // engine.config.idle_chunk_tokens + 8)
    text, cur = text[:cur] + "y" + text[cur:], cur + 1
    out = key(text, cur)
    assert out.context["prefix_tokens"] == len(near.prefix_tokens) and engine.session(path).anchor.base == anchor.inner


@settings(max_examples=6, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=st.sampled_from(range(len(DOCS))), at=st.floats(0.6, 0.95), polls=st.integers(2, 5),
       typed=st.text("abc_ (\n", min_size=1, max_size=4))
def test_keystrokes_on_nearest_near_and_window_plans_answer_as_cold(wide, wide_reference, doc, at, polls, typed):
    """Cold cursors deep in a file, growth interrupted by keystrokes (new lines too) as it goes
    through the nearest, near and window plans: every answer equals its plan computed cold, and the
    nearest window's plan is taken on the way."""
    engine, text, path = wide, DOCS[doc], f"nearest-{doc}.py"
    engine.forget(path)
    engine.clear_slots()  # (an earlier example's slots hold the same text)
    cur = text.index("\n", int(len(text) * at)) + 1
    engine.complete(CompletionRequest(text, cur, path=path, layout="efim", max_prompt_ms=40, max_tokens=1))
    innermost = engine.session(path).anchor.innermost
    bases = []
    for ch in (typed + "xyz_") * 12:
        out, req = _key_after_growth(engine, path, text, cur, ch, polls, 40, 3)
        text, cur = req.text, req.cursor
        cold = wide_reference.run(engine.plan(req).tokens, Options(max_tokens=3, ignore_eog=True), cold=True)
        assert out.token_ids == cold.token_ids
        bases.append(engine.session(path).anchor.base)
    assert not innermost or innermost in bases, bases
