"""Instant answers (issue 24): a keystroke that types on the shown answer, an accept, and a plan
answered before are served without evaluating a prompt token, and each answer equals the same plan
computed cold (temperature 0)."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from efim_local.engine import CompletionRequest, Engine
from efim_local.engine.steps import Steps
from efim_local.engine.stream import typed_over
from efim_local.prompt.windows import MAX_CLOSERS, line_closers
from efim_local.request import Options

from tests.helpers import small_config, sources

CFG = dict(n_ctx_seq=2048, max_tokens=12, heal=True, answer_cache=256)
REPLACEMENT = "\ufffd"  # shown for bytes that are not UTF-8 yet: typing it types other bytes


@pytest.fixture(scope="module")
def engine(tiny_model):
    with Engine(small_config(**CFG), tiny_model) as e:
        yield e


@pytest.fixture(scope="module")
def reference(tiny_model):
    with Engine(small_config(n_slots=1, **CFG), tiny_model) as e:
        yield e


def cold(reference, out, how=None):
    """The plan an answer came from, computed cold."""
    p = out.prompt
    return reference.run(p.tokens, how or Options(), cold=True, closers=p.closers, heal=p.heal)


class Decodes:
    """Counts the engine's llama_decode calls (what a known answer must not need)."""

    def __init__(self, engine):
        self.n, self.decoder = 0, engine.decoder
        self.plain = self.decoder.decode

    def __enter__(self):
        def counted(slot, *args):
            self.n += 1
            return self.plain(slot, *args)

        self.decoder.decode = counted
        return self

    def __exit__(self, *exc):
        self.decoder.decode = self.plain


def doc_at(i: int, at: int) -> tuple[str, int]:
    src = sources()[i][:3000]
    cur = src.index("\n", at) + 1 + 4
    return src, min(cur, len(src))


@settings(max_examples=10, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(i=st.integers(0, 5), at=st.integers(300, 2500), ahead=st.booleans(),
       steps=st.lists(st.integers(1, 4), min_size=1, max_size=5))
def test_typing_the_answer_is_answered_from_its_trail_and_equals_cold(engine, reference, i, at, ahead, steps):
    doc, cur = doc_at(i, at)
    path = f"through-{i}.py"
    engine.clear_slots()
    out = engine.complete(CompletionRequest(doc, cur, path=path))
    assert out.source == "computed" and out.text == cold(reference, out).text
    for n in steps:
        if ahead:
            engine.ahead(path)
        typed = out.text[:n]
        if not typed:
            break
        doc, cur = doc[:cur] + typed + doc[cur:], cur + len(typed)
        with Decodes(engine) as d:
            out = engine.complete(CompletionRequest(doc, cur, path=path))
        assert out.text == cold(reference, out).text, (typed, out.source)
        if REPLACEMENT not in typed:
            assert out.source in ("type-through", "accept") and out.tokens.evaluated == 0
            if ahead:  # the continuation was computed ahead: nothing is decoded
                assert d.n == 0, (typed, out.stop_reason)


def cancelled_after(engine, doc: str, cur: int, path: str, k: int, **kw):
    """The file's trail after an answer cancelled once it generated ``k`` tokens (as a keystroke does)."""
    from efim_local.errors import Cancelled

    engine.clear_slots()
    engine.forget(path)
    got = lambda: len(engine.instant.shown[path].ids) if path in engine.instant.shown else 0  # noqa: E731
    try:
        engine.complete(CompletionRequest(doc, cur, path=path, **kw), should_stop=lambda: got() >= k)
    except Cancelled:
        pass
    return engine.instant.shown[path]


@settings(max_examples=10, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(i=st.integers(0, 5), at=st.integers(300, 2500), k=st.integers(1, 3), n=st.integers(1, 8))
def test_a_cancelled_answer_goes_on_ahead_and_the_keys_that_cancelled_it_type_through(engine, reference, i, at,
                                                                                   k, n):
    """The keys that cancel an answer mostly type its start. Cancelled after ``k`` tokens (the text
    healed perhaps not spelled out yet), its trail is extended ahead as the scheduler does after a
    cancel (``FollowUp.after``), and the request after ``n`` typed characters is answered from the
    trail, with nothing evaluated, as the same plan computed cold."""
    doc, cur = doc_at(i, at)  # four characters into a line: mid-indentation or mid-word, healed
    path = f"cancelled-{i}.py"
    full = reference.complete(CompletionRequest(doc, cur, path=path)).text
    s = cancelled_after(engine, doc, cur, path, k)
    assert len(s.ids) <= k
    engine.ahead(path, limit=engine.policy.ahead_cancelled, typed=0)  # nothing of it typed yet
    assert len(s.ids) > k or engine.instant.ends(s.ids[-1])
    typed = full[:n]
    if not typed:
        return
    doc, cur = doc[:cur] + typed + doc[cur:], cur + len(typed)
    out = engine.complete(CompletionRequest(doc, cur, path=path))
    assert out.text == cold(reference, out).text, (typed, out.source)
    if REPLACEMENT not in typed:
        assert out.source in ("type-through", "accept") and out.tokens.evaluated == 0


@pytest.fixture
def slow(engine):
    """The engine at 1 ms per new token: a 150 ms budget reduces the plans of these files."""
    from efim_local.engine.speed import PrefillSpeed

    old, engine.speed = engine.speed, PrefillSpeed.fixed(1.0)
    yield engine
    engine.speed = old


def reduced_answer(engine, name: str):
    """A file's answer from a reduced plan (two characters at least, whole ones): doc, cursor, path, it."""
    for i, at in [(i, at) for i in range(2, 6) for at in range(1500, 2600, 100)]:
        doc, cur = doc_at(i, at)
        path = f"{name}-{i}.py"
        engine.clear_slots()
        engine.forget(path)
        out = engine.complete(CompletionRequest(doc, cur, path=path, max_prompt_ms=150))
        if out.context["reduced"] and len(out.text) >= 2 and REPLACEMENT not in out.text[:2]:
            return doc, cur, path, out
    pytest.fail("no reduced plan with an answer")


def test_a_stage_of_growth_makes_the_next_keystroke_take_it_rather_than_type_through(slow, reference):
    """A reduced plan's answer typed through keeps its context; once growth has computed a stage of
    the full plan, the next keystroke takes the stage (more context, a few typed tokens evaluated)
    instead, and answers as that plan computed cold."""
    engine = slow
    doc, cur, path, out = reduced_answer(engine, "staged")
    steps = Steps(engine.growth.grow_steps(path))
    while path in engine.instant.shown:  # idle time, until a stage is computed
        next(steps)
    steps.close()
    assert engine.session(path).anchor.reduced  # a stage, not the whole growth
    d, c = doc[:cur] + out.text[:1] + doc[cur:], cur + 1  # a key typing the answer's start
    nxt = engine.complete(CompletionRequest(d, c, path=path, max_prompt_ms=150))
    assert nxt.source == "computed" and nxt.context["tokens"] > out.context["tokens"], nxt.context
    assert nxt.text == cold(reference, nxt).text


def test_a_keystroke_after_growth_plans_on_the_grown_plan_not_through_the_reduced_answer(slow, reference):
    """Once growth has computed a reduced plan's full context, the next keystroke plans on the full
    plan (cached), even when it types the start of the answer the reduced plan gave: typing through
    that answer would run the reduced plan in the slot that shares most of it, the grown one, and cut
    the grown suffix (paced replay: the full plan lost within a second, every answer reduced after)."""
    engine = slow
    doc, cur, path, out = reduced_answer(engine, "grown")
    engine.grow(path)  # idle time: to the full plan
    assert not engine.session(path).anchor.reduced
    for n in (1, 2):  # two keys typing the answer's start
        d, c = doc[:cur] + out.text[:n] + doc[cur:], cur + n
        nxt = engine.complete(CompletionRequest(d, c, path=path, max_prompt_ms=150))
        assert not nxt.context["reduced"], (n, nxt.source, nxt.context)
        assert nxt.text == cold(reference, nxt).text


def test_a_request_stops_the_continuation_computed_ahead(engine):
    """The continuation computed ahead is background work: a request that comes stops its decode
    (the token is dropped, the trail and the slot stay consistent), and it goes on later to the same
    tokens."""
    from efim_local.errors import Interrupted

    doc, cur = doc_at(3, 1500)
    engine.clear_slots()
    engine.forget("ahead.py")
    engine.complete(CompletionRequest(doc, cur, path="ahead.py"))
    s = engine.instant.shown["ahead.py"]
    before = list(s.ids)
    engine.interruptible(True)  # as the scheduler runs background work
    try:
        engine.ctx.interrupt()  # a request came
        with pytest.raises(Interrupted):
            next(engine.trail.ahead_steps("ahead.py"))
        assert s.ids == before
        engine.interruptible(True)  # the next background step
        steps = engine.trail.ahead_steps("ahead.py")
        next(steps)
        steps.close()
    finally:
        engine.interruptible(False)
    assert s.ids[:len(before)] == before and len(s.ids) == len(before) + 1
    engine.ahead("ahead.py")
    extended = list(s.ids)
    engine.clear_slots()
    engine.complete(CompletionRequest(doc, cur, path="ahead.py"))
    engine.ahead("ahead.py")  # uninterrupted: the same continuation
    assert engine.instant.shown["ahead.py"].ids == extended


def test_the_trail_keeps_a_lead_past_what_was_typed(engine):
    """``limit`` counts from the trail's tokens the user typed (``typed``; default: the answer's), not
    from the trail's end: neither a keystroke that types on it nor a restarted task lengthens it each
    time. A keystroke computes ``typed`` from what its text covers (``Runner.keystroke_steps``)."""
    from efim_local.engine.steps import drive

    lead = engine.policy.ahead_cancelled
    for i, at in [(i, at) for i in range(2, 6) for at in range(1200, 2500, 100)]:
        doc, cur = doc_at(i, at)
        s = cancelled_after(engine, doc, cur, "lead.py", 3, max_tokens=3 + lead + 4)  # (not what caps it)
        first = engine.model.piece(s.ids[0]).decode("utf-8", "replace")
        if len(s.ids) == 3 and not engine.instant.ends(s.ids[-1]) and not s.heal and first.isprintable() \
                and first and REPLACEMENT not in first:
            break
    else:
        pytest.fail("no answer of three tokens to type on")
    engine.ahead("lead.py", limit=2, typed=1)  # 1 typed + 2 ahead: held already
    engine.ahead("lead.py", limit=2)  # from the answer's end (a cancelled answer has none): held too
    assert len(s.ids) == 3
    # The user types the answer's first token: 1 typed (a cancelled answer has no tokens of its own)
    f = engine.files.entry("lead.py")
    f.text, f.version, f.open, f.caret = doc[:cur] + first + doc[cur:], 2, True, cur + len(first)
    drive(engine.runner.keystroke_steps("lead.py", 2, Options(max_tokens=3 + lead + 4), lambda: False))
    assert len(s.ids) == 1 + lead or engine.instant.ends(s.ids[-1])  # not 0 + the lead, nor 3 + it
    assert len(s.ids) > 3


def test_the_trail_stays_short_while_the_plan_is_reduced(slow):
    """Growth has work: a cancelled answer's trail goes on for at most ``Policy.ahead_reduced``
    tokens (the engine's time goes to the context; paced replay: 81% of the full plans against 66%);
    an answer's own continuation is whole, and an accept is answered from it without a decode."""
    engine, lead = slow, slow.policy.ahead_reduced
    for i, at in [(i, at) for i in range(2, 6) for at in range(1500, 2500, 250)]:
        doc, cur = doc_at(i, at)
        s = cancelled_after(engine, doc, cur, "short.py", 1, layout="efim", max_prompt_ms=100)
        if not engine.instant.ends(s.ids[-1]):
            break
    else:
        pytest.fail("every answer ended at once")
    assert engine.reduced("short.py")
    engine.ahead("short.py", limit=engine.policy.ahead_cancelled, typed=0)  # as FollowUp.after does
    assert len(s.ids) == lead or (1 < len(s.ids) < lead and engine.instant.ends(s.ids[-1]))
    out = engine.complete(CompletionRequest(doc, cur, path="short.py", layout="efim", max_prompt_ms=100))
    assert out.context["reduced"] and engine.reduced("short.py")
    engine.ahead("short.py")  # the answer's own continuation: to its max_tokens past it
    s = engine.instant.shown["short.py"]
    assert len(s.ids) == s.n_answer + s.max_tokens or engine.instant.ends(s.ids[-1])
    with Decodes(engine) as d:
        doc, cur = doc[:cur] + out.text + doc[cur:], cur + len(out.text)
        nxt = engine.complete(CompletionRequest(doc, cur, path="short.py", layout="efim", max_prompt_ms=100))
    assert nxt.source == "accept" and d.n == 0 and nxt.tokens.evaluated == 0


def test_accept_after_ahead_needs_no_decode(engine, reference):
    # an answer that is whole text (typing a REPLACEMENT types other bytes)
    for i, at in [(i, at) for i in range(2, 6) for at in range(1200, 2500, 100)]:
        doc, cur = doc_at(i, at)
        engine.clear_slots()
        engine.forget("accept.py")
        out = engine.complete(CompletionRequest(doc, cur, path="accept.py"))
        if REPLACEMENT not in out.text:
            break
    assert REPLACEMENT not in out.text
    engine.ahead("accept.py")  # while the answer is shown
    assert len(engine.instant.shown["accept.py"].ids) > len(out.token_ids)
    engine.instant.note_accepted("accept.py")  # the editor's accepted notification
    doc, cur = doc[:cur] + out.text + doc[cur:], cur + len(out.text)
    with Decodes(engine) as d:
        nxt = engine.complete(CompletionRequest(doc, cur, path="accept.py"))
    assert nxt.source == "accept" and nxt.tokens.evaluated == 0
    assert d.n == 0 or nxt.stop_reason == "eog"
    assert nxt.text == cold(reference, nxt).text


def test_accept_word_keeps_the_kv_and_equals_cold(engine, reference):
    doc, cur = doc_at(4, 900)
    engine.clear_slots()
    out = engine.complete(CompletionRequest(doc, cur, path="word.py", max_tokens=16))
    engine.ahead("word.py")
    word = out.text[:max(1, len(out.text) // 2)]
    doc, cur = doc[:cur] + word + doc[cur:], cur + len(word)
    nxt = engine.complete(CompletionRequest(doc, cur, path="word.py", max_tokens=16))
    assert nxt.text == cold(reference, nxt, Options(max_tokens=16)).text
    if REPLACEMENT not in word:
        assert nxt.source == "type-through" and nxt.tokens.evaluated == 0


def test_the_same_plan_again_is_answered_from_the_cache(engine, reference):
    doc, cur = doc_at(3, 700)
    engine.clear_slots()
    first = engine.complete(CompletionRequest(doc, cur, path="cache.py"))
    # type a character, then delete it: the plan is the first one again
    engine.complete(CompletionRequest(doc[:cur] + "#" + doc[cur:], cur + 1, path="cache.py"))
    again = engine.complete(CompletionRequest(doc, cur, path="cache.py"))
    assert again.source == "cache" and again.tokens.evaluated == 0 and again.text == first.text
    assert again.text == cold(reference, again).text
    # shared by content: another path (another editor, the CLI) with the same plan
    other = engine.complete(CompletionRequest(doc, cur, path="cache-copy.py"))
    assert other.text == cold(reference, other).text
    assert other.source == ("cache" if other.prompt == again.prompt else "computed")
    # other options that shape the output are another entry
    shorter = engine.complete(CompletionRequest(doc, cur, path="cache.py", max_tokens=3))
    assert shorter.source == "computed"


def test_typing_off_the_answer_is_computed(engine, reference):
    doc, cur = doc_at(1, 800)
    engine.clear_slots()
    out = engine.complete(CompletionRequest(doc, cur, path="off.py"))
    wrong = "@" if not out.text.startswith("@") else "!"
    doc, cur = doc[:cur] + wrong + doc[cur:], cur + 1
    nxt = engine.complete(CompletionRequest(doc, cur, path="off.py"))
    assert nxt.source == "computed" and nxt.tokens.evaluated > 0


def test_sampled_answers_are_never_typed_through(engine):
    doc, cur = doc_at(0, 600)
    engine.clear_slots()
    out = engine.complete(CompletionRequest(doc, cur, path="hot.py", temperature=0.8, seed=3))
    if not out.text:
        return
    doc, cur = doc[:cur] + out.text[:1] + doc[cur:], cur + 1
    nxt = engine.complete(CompletionRequest(doc, cur, path="hot.py", temperature=0.8, seed=3))
    assert nxt.source == "computed"


def test_a_superseded_answer_is_typed_through(engine, reference):
    """While an answer streams, the user types its first character: the newer request supersedes
    it, the older ends first (its slot and trail are the newer one's), and the newer is answered
    from the trail it left."""
    import threading

    from efim_local.engine.scheduler import Scheduler
    from efim_local.engine.tasks import RequestTask

    engine.clear_slots()
    s = Scheduler(engine)
    thread = threading.Thread(target=s.run, daemon=True)
    thread.start()
    results, ended = {}, threading.Event()
    doc, cur = doc_at(5, 1500)
    try:
        def typed(piece):
            if "second" in results or not piece or REPLACEMENT in piece[0]:
                return
            results["second"] = None
            d = doc[:cur] + piece[0] + doc[cur:]
            second = RequestTask("k", CompletionRequest(d, cur + 1, path="sup.py", max_tokens=12))
            second.future.add_done_callback(lambda fut: (results.__setitem__("second", outcome(fut)), ended.set()))
            s.submit(second)

        def outcome(fut):
            err = fut.exception()
            return (None if err else fut.result()), err

        first = RequestTask("k", CompletionRequest(doc, cur, path="sup.py", max_tokens=12), on_text=typed)
        first.future.add_done_callback(lambda fut: results.__setitem__("first", outcome(fut)))
        s.submit(first)
        assert ended.wait(120)
    finally:
        s.stop()
        thread.join(120)
    out, err = results["second"]
    assert err is None, err
    from efim_local.errors import Cancelled

    assert isinstance(results["first"][1], Cancelled)  # superseded while it streamed
    assert out.source == "type-through" and out.tokens.evaluated == 0
    assert out.text == cold(reference, out).text


def call_sites(i: int) -> list[int]:
    """Offsets just after a name at which code calls it (``name(``): where typing ``(`` makes an editor's
    auto-pairs put ``)`` after the cursor."""
    import re

    src = sources()[i][:3000]
    return [m.end() - 1 for m in re.finditer(r"\b[a-z_]+\(", src)][5::7]


def same_as_cold(reference, out, how):
    """An answer is its plan's computed cold: the text, where and why it stopped, what it replaces."""
    want = cold(reference, out, how)
    assert (out.text, out.stop_reason, out.replaces) == (want.text, want.stop_reason, want.replaces), (out, want)


def test_an_answer_types_over_auto_paired_closers_and_taking_it_types_through(engine, reference):
    """Typing ``(`` puts ``)`` after the cursor (``f(`` in a call: ``print(f(|))``, two). With ``type_over``
    the answer goes on past the closers it types and replaces them; the document with the answer taken
    (its closers replaced) is answered from the trail. Without it, the answer stops before the closer,
    and the editor's own type-over of the closer (the caret moves past it, the text stays) types
    through. Every answer equals its plan computed cold."""
    over = Options(type_over=True)
    replaced = typed_over_by_editor = replaced_both = 0
    for i in range(4):
        src = sources()[i][:3000]
        for cur, typed in [(c, "(") for c in call_sites(i)[:3]] + [(c, "(f(") for c in call_sites(i)[:5]]:
            auto = ")" * typed.count("(")  # what the editor puts after the cursor
            for how in (over, Options()):
                path = f"over-{i}-{cur}-{len(typed)}-{how.type_over}.py"
                base = src[:cur] + src[cur + 1:]  # the call's "(" not typed yet, the caret after the name
                engine.complete(CompletionRequest(base, cur, path=path, **how.to_params()))  # the anchor
                doc, at = base[:cur] + typed + auto + base[cur:], cur + len(typed)  # the editor put the closers
                out = engine.complete(CompletionRequest(doc, at, path=path, **how.to_params()))
                own = line_closers(base[cur:])  # and those that ended the line already (the outer call's)
                closers = auto + own if len(auto + own) <= MAX_CLOSERS else auto
                assert out.context.get("closers") == closers
                same_as_cold(reference, out, how)
                assert out.replaces == (typed_over(out.text, closers)[0] if how.type_over else 0), out.text
                replaced_both += len(auto) == 2 and out.replaces >= 2
                if REPLACEMENT in out.text or 0 < out.replaces < len(closers):  # (bytes that are not UTF-8 yet:
                    continue  # typing the text types others; closers left: the next answer plans them)
                if how.type_over and out.replaces:  # the editor takes the answer: it replaces the closers
                    replaced += 1
                    doc, at = doc[:at] + out.text + doc[at + out.replaces:], at + len(out.text)
                elif not how.type_over and out.stop_reason == "closer" and len(closers) == 1:  # typed, then over ")"
                    doc, at = doc[:at] + out.text + doc[at:], at + len(out.text)
                    engine.complete(CompletionRequest(doc, at, path=path))
                    typed_over_by_editor += 1
                    at += 1
                else:
                    continue
                engine.ahead(path)  # as the daemon does while an answer is shown
                nxt = engine.complete(CompletionRequest(doc, at, path=path, **how.to_params()))
                assert nxt.source in ("accept", "type-through") and nxt.tokens.evaluated == 0, (out.text, nxt)
                assert nxt.prompt.closers == ""  # none left after the cursor
                same_as_cold(reference, nxt, how)
    assert replaced >= 2 and typed_over_by_editor >= 2  # the sweep exercises both
    assert replaced_both >= 1  # and an answer that types over both closers of print(f(|))
