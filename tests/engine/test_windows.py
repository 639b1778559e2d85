"""Files bigger than a slot: the window's head is reused across cursor jumps, exactly."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from efim_local.engine import CompletionRequest, Engine
from efim_local.request import Options

from tests.helpers import sources, small_config

N_CTX = 1024


@pytest.fixture(scope="module")
def engine(tiny_model):
    with Engine(small_config(n_ctx_seq=N_CTX), tiny_model) as e:
        yield e


@pytest.fixture(scope="module")
def reference(tiny_model):
    with Engine(small_config(n_ctx_seq=N_CTX, n_slots=1), tiny_model) as e:
        yield e


def big_doc() -> str:
    return "".join(sources()[:3])  # far bigger than a slot of 1024 tokens


def line_offset(doc: str, n: int) -> int:
    lines = doc.splitlines(keepends=True)
    return sum(map(len, lines[:n]))


def test_a_cursor_jump_inside_the_window_evaluates_the_lines_between_and_the_suffix(engine):
    doc, path = big_doc(), "window.py"
    engine.forget(path)
    first = engine.complete(CompletionRequest(doc, line_offset(doc, 300), path=path, layout="efim"))
    window = engine.session(path).anchor.window
    assert first.trimmed["prefix_tokens"] > 0 and window > 0
    for a, b in ((300, 302), (302, 299), (299, 301)):
        out = engine.complete(CompletionRequest(doc, line_offset(doc, b), path=path, layout="efim"))
        anchor = engine.session(path).anchor
        assert anchor.window == window, "the window moved"
        between = engine.planner.tokenize(doc[line_offset(doc, min(a, b)):line_offset(doc, max(a, b))])
        # The lines between the two cursors (when the cursor went down), the suffix, the markers.
        bound = (len(between) if b > a else 0) + len(anchor.suffix_tokens) + 8
        assert out.tokens.evaluated <= bound, (a, b, out.tokens, bound)
        assert out.tokens.cached >= len(anchor.prefix_tokens) - len(between) - 2


@settings(max_examples=10, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(moves=st.lists(st.integers(-12, 12), min_size=2, max_size=5), start=st.integers(150, 450))
def test_windowed_plans_answer_as_computed_cold(engine, reference, moves, start):
    doc, path = big_doc(), f"window-{start}.py"
    engine.forget(path)
    line = start
    for m in [0, *moves]:
        line = max(1, line + m)
        req = CompletionRequest(doc, line_offset(doc, line) + 2, path=path, layout="efim", max_tokens=6)
        out = engine.complete(req)
        plan = engine.plan(req)  # the same anchor again: the same plan
        assert out.token_ids == reference.run(plan.tokens, Options(max_tokens=6), cold=True).token_ids


def test_a_file_of_megabytes_plans_from_the_text_around_the_cursor(engine, reference):
    """A cursor deep in a huge file: the plan tokenizes only the text around it (reported in
    characters), moves inside it reuse its head, and the answers are the cold ones."""
    doc, path = big_doc() * 40, "huge.py"  # about 2 MB
    engine.forget(path)
    lines = doc.count("\n")
    for n in (lines // 2, lines // 2 + 1, lines // 2):  # (a 1024-token slot's window moves every few lines)
        req = CompletionRequest(doc, line_offset(doc, n) + 2, path=path, layout="efim", max_tokens=6)
        out = engine.complete(req)
        cut = engine.session(path).anchor.cut
        assert out.trimmed["prefix_chars"] == cut[0] > len(doc) // 3 and out.trimmed["suffix_chars"] == cut[1] > 0
        assert len(doc) - cut[0] - cut[1] < 4 * engine.planner.text_span()
        assert out.token_ids == reference.run(engine.plan(req).tokens, Options(max_tokens=6), cold=True).token_ids
    assert out.tokens.cached > out.tokens.evaluated  # the move back reused the window's head
