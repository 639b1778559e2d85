"""A run on the prompt its slot last answered samples its first token from the logits kept then
(``Decoder.kept_logits``): a keystroke mid-word backs off the same partial word as the one before, so
its prompt is the last one's, and decoding its last token again would cost a whole decode (~30 ms on
the 0.5B, 2 cores). The answer equals the same run computed cold (hypothesis, on the batch-invariant
f32 tiny model), with nothing evaluated."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from efim_local.engine import Engine
from efim_local.request import Options

from tests.helpers import small_config, sources

CFG = dict(n_ctx_seq=1024, max_tokens=8)


@pytest.fixture(scope="module")
def engine(tiny_model):
    with Engine(small_config(n_slots=2, **CFG), tiny_model) as e:
        yield e


@pytest.fixture(scope="module")
def reference(tiny_model):
    with Engine(small_config(n_slots=1, **CFG), tiny_model) as e:
        yield e


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(i=st.integers(0, 5), at=st.integers(100, 1500), typed=st.integers(0, 3), again=st.integers(1, 3))
def test_a_run_on_the_prompt_its_slot_answered_last_samples_from_the_kept_logits(engine, reference, i, at, typed,
                                                                                again):
    src = sources()[i]
    words = [k for k in range(at, min(len(src) - 8, at + 400)) if src[k - 1].isspace() and src[k:k + 4].isalpha()]
    start = words[0] if words else at
    prompt = engine.model.tokenize(src[:start])
    first = engine.run(prompt, Options(), heal=src[start:start + typed].encode())
    heal = src[start:start + typed + again].encode()  # the next keystroke: one more character of the word
    out = engine.run(prompt, Options(), heal=heal)
    assert out.tokens.evaluated == 0 and out.tokens.cached == len(prompt), (first.tokens, out.tokens)
    want = reference.run(prompt, Options(), cold=True, heal=heal)
    assert (out.token_ids, out.text, out.stop_reason) == (want.token_ids, want.text, want.stop_reason)


def test_kept_logits_are_not_used_for_another_prompt_or_once_the_kv_under_it_changed(engine, reference):
    src = sources()[1]
    prompt = engine.model.tokenize(src[:600])
    engine.run(prompt, Options())
    other = prompt[:-1]  # a prompt the slot holds, but whose last token's logits were never kept
    out = engine.run(other, Options())
    assert out.tokens.evaluated == 1
    want = reference.run(other, Options(), cold=True)
    assert out.token_ids == want.token_ids
    slot = engine.slots.slots[out.slot]
    assert engine.decoder.kept_logits(slot, prompt) is None  # (it kept the logits after ``other`` now)
    slot.reset()
    assert engine.decoder.kept_logits(slot, other) is None
