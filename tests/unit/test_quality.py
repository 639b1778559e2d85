"""The quality benchmark's bookkeeping: what the user typed last, paired intervals, the summary."""

import numpy as np

from efim_local.eval import quality


def test_what_the_user_typed_last():
    assert [quality.typed_class(t) for t in ("", "x\n", "x = ", "f(", "retur", "a_", "\t")] == \
        ["nothing", "nothing", "whitespace", "punctuation", "word", "word", "whitespace"]


def test_paired_interval_of_a_difference():
    a, b = np.array([1, 1, 1, 0] * 25), np.array([1, 0, 1, 0] * 25)
    mean, lo, hi = quality.paired(a, b)
    assert mean == 25.0 and 15 < lo < 25 < hi < 35
    assert quality.paired(a, a) == (0.0, 0.0, 0.0)


def test_summary_compares_the_better_fim_row_with_the_default():
    row = lambda exact, cls="word": {"exact": exact, "pass": exact, "reason": "eog", "special": False, "class": cls}
    rows = {"fim": [row(1), row(0, "whitespace")], "fim+heal": [row(1), row(1, "whitespace")],
            "default": [row(1), row(0, "whitespace")]}
    s = quality.summarize(rows)
    assert [x["exact_%"] for x in s["layouts"]] == [50.0, 100.0, 50.0]
    (ws,) = [d for d in s["paired"] if d["typed last"] == "whitespace" and d["metric"] == "exact"]
    assert ws["fim side"] == "fim+heal" and ws["better - default"] == 100.0
