"""The context benchmark's pieces that need no model: the text typed next, llama.vim's window and
the bootstrap intervals."""

import random

import pytest

from efim_local.bench import context, paced
from efim_local.bench.trace import Commit


def test_typed_next_is_what_the_user_types_to_the_line_end():
    before = "def f(x):\n    return x\n"
    after = "def f(x):\n    y = g(x, [1])\n    return y\n"
    st = paced.steps([Commit("f.py", "sha", "subject", before, after)])
    at = lambda text: next(i for i, s in enumerate(st) if s.kind in ("key", "over") and s.doc[:s.cursor].endswith(text))
    # Auto-pairs put ")" and "]" after the cursor; the user types over them, and those count as typed.
    assert context.typed_next(st, at("y = g")) == "(x, [1])"
    assert context.typed_next(st, at("y = g"), max_chars=3) == "(x,"
    assert context.typed_next(st, at("[1])")) == ""  # a newline comes next
    jump = next(i for i, s in enumerate(st) if s.kind == "jump")
    assert context.typed_next(st, jump).startswith("    y = g(")
    assert context.typed_next(st, len(st) - 1) == ""


def test_vim_window_is_256_lines_before_and_64_after():
    doc = "".join(f"line {i}\n" for i in range(1000))
    cursor = doc.index("line 500\n") + 4
    left, right = context.vim_window(doc, cursor)
    assert left.startswith("line 244\n") and left.endswith("line 500"[:4])
    assert left.count("\n") == 256
    assert right.startswith(" 500\n") and right.endswith("line 564\n") and right.count("\n") == 65
    left, right = context.vim_window("a\nbc", 3)  # near the file's ends: what there is
    assert (left, right) == ("a\nb", "c")


def test_bootstrap_intervals_cover_the_mean_and_pair_the_differences():
    rng = random.Random(1)
    chars = [rng.randint(5, 32) for _ in range(300)]
    full = [c * rng.uniform(1.0, 3.0) for c in chars]
    bits = {"used": [b * 1.1 for b in full], "full": full, "llama.vim": [b + c * rng.uniform(0, 0.4)
                                                                       for b, c in zip(full, chars)]}
    out = context.bootstrap(bits, chars, n_boot=400)
    for k, v in out["bpc"].items():
        lo, hi = v["ci95"]
        assert lo < v["mean"] < hi and v["mean"] == pytest.approx(sum(bits[k]) / sum(chars))
    d = out["diff"]["used - full"]
    # "used" is exactly 10% more than "full" request by request: the paired interval is a point.
    assert d["rel"] == pytest.approx(0.10) and d["rel_ci95"] == pytest.approx((0.10, 0.10))
    assert d["ci95"][1] - d["ci95"][0] < out["bpc"]["full"]["ci95"][1] - out["bpc"]["full"]["ci95"][0]
    lo, hi = out["diff"]["llama.vim - full"]["ci95"]
    assert 0 < lo < 0.2 < hi < 0.3  # llama.vim adds 0.2 bits/char on average
    assert context.bootstrap(bits, chars, n_boot=400) == out  # seeded: the same intervals each run
