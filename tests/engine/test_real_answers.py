"""Answers on a real code model (Qwen2.5-Coder 0.5B Instruct, `make qwen`; skipped without it): what
the answer-quality issue found wrong, as a user meets it. Greedy, no latency budget, the defaults
(EFIM with healing)."""

import pytest

from efim_local.config import Config
from efim_local.engine import CompletionRequest, Engine
from efim_local.llama import ContextParams

MEAN = "def mean(xs):\n    return sum(xs) / "


@pytest.fixture(scope="module")
def qwen(qwen05):
    cfg = Config(model=str(qwen05), max_tokens=48, max_prompt_ms=0, context=ContextParams(n_ctx_seq=1024, n_slots=2))
    with Engine(cfg, qwen05) as e:
        yield e


def answer(e, before: str, after: str, **how) -> object:
    e.forget("t.py")
    return e.complete(CompletionRequest(before + after, len(before), path="t.py", max_tokens=48, **how))


def test_after_a_space_the_answer_does_not_start_with_another(qwen):
    out = answer(qwen, MEAN, "\n")
    assert out.text.startswith("len(xs)"), out.text  # not " len(xs)": a double space in the editor


def test_a_partial_word_spanning_tokens_is_finished(qwen):
    out = answer(qwen, "def h(x):\n    if x > 0:\n        retur", "\n    return 0\n")
    assert out.text.startswith("n "), out.text  # not " x": one token of back-off left "retur" a word
    out = answer(qwen, "def positives(numbers):\n    result = []\n    for n in numbe",
                 "\n        if n > 0:\n            result.append(n)\n    return result\n")
    assert out.text.startswith("rs:"), out.text  # not ":", skipping the rest of the word


def test_the_answer_ends_with_the_middle(qwen):
    """An Instruct model runs on past the middle (a new function, `# Example usage`): the answer
    ends where it leaves its block, and holds no special token's text."""
    out = answer(qwen, MEAN, "\n\n\ndef median(xs):\n    pass\n")
    assert out.stop_reason in ("eog", "block", "repeat", "rejoin") and "\ndef " not in out.text, out
    assert "<|" not in out.text and out.text.strip() and out.tokens.generated < 48


def test_healing_reaches_what_one_token_of_back_off_did_not(qwen):
    """With healing off the middle's last tokens stay as typed; on, the answer spells them again."""
    typed = "def check(s):\n    for c in s:\n        if c "
    rest = "\n            return True\n    return False\n"
    healed = answer(qwen, typed, rest)
    assert not healed.text.startswith(" "), healed.text
    assert healed.tokens.prompt < answer(qwen, typed, rest, heal=False).tokens.prompt
