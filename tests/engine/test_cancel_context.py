"""A request cancelled in its prefill says what it planned (the context benchmark scores its plan)."""

import pytest

from efim_local.engine import CompletionRequest, Engine
from efim_local.errors import Cancelled
from tests.helpers import small_config


def test_cancelled_in_prefill_reports_its_plan(tiny_model):
    doc = "def add(a, b):\n    return a + b\n\n" * 40 + "def sub(a, b):\n    return "
    with Engine(small_config(), tiny_model) as e:
        with pytest.raises(Cancelled) as exc:
            e.complete(CompletionRequest(doc, len(doc), path="c.py", max_tokens=4), should_stop=lambda: True)
        ctx = exc.value.data["context"]
        assert ctx["prefix_tokens"] > 100 and ctx["middle_tokens"] >= 1 and ctx["reduced"] is False
        assert "timings" not in exc.value.data and exc.value.data["reanchor"] == "new_session"
        out = e.complete(CompletionRequest(doc, len(doc), path="c.py", max_tokens=4))
        assert out.context == ctx  # the same plan, answered
