"""One file, one slot: an edit at the top of a file re-plans it in its own slot; another file's
growth never takes the slots of the files in use."""

from efim_local.engine import CompletionRequest, Engine
from efim_local.engine.speed import PrefillSpeed
from efim_local.errors import Cancelled
from efim_local.training.corpus import read_texts, stdlib_files
from tests.helpers import small_config, stop_after

DOC = "import os\n" + "def f(a):\n    return a + 1\n" * 20


def test_an_edit_at_the_top_keeps_the_file_in_one_slot(tiny_model):
    with Engine(small_config(), tiny_model) as e:
        e.complete(CompletionRequest(DOC, len(DOC) - 5, path="/w/p.py", max_tokens=2))
        e.complete(CompletionRequest("x = 2\n", 6, path="/w/q.py", max_tokens=2))
        edited = "# x\n" + DOC
        out = e.complete(CompletionRequest(edited, len(edited) - 5, path="/w/p.py", max_tokens=2))
        paths = [s["path"] for s in e.status()["slots"] if s["tokens"]]
        assert sorted(paths) == ["/w/p.py", "/w/q.py"]
    with Engine(small_config(), tiny_model) as cold:  # the same answer as from an empty cache
        assert cold.complete(CompletionRequest(edited, len(edited) - 5, path="/w/p.py", max_tokens=2)).text == out.text


def test_files_in_use_keep_their_slots_while_another_files_growth_runs(tiny_model):
    """Issue 39: late in an hour, all 4 slots held one file (its growth went on while idle) though 7
    other files had been edited since. Growth's copies were dated by when it ran, so they looked the
    most recently used: its next copy took the least recently used slot, another file's (the one just
    edited too), never its own superseded copies, and requests evicted the files in use first."""
    big = next(t[:6000] for t in read_texts(stdlib_files(400_000)) if len(t) > 6000)
    small = [f"def f{i}(a, b):\n    return a * {i} + b\n\n\nx{i} = f{i}(1, 2)\n" for i in range(6)]
    grown = 0
    with Engine(small_config(n_ctx_seq=2048, n_slots=4, idle_chunk_tokens=32), tiny_model) as e:
        e.speed = PrefillSpeed.fixed(1.0)  # 1 ms a token: the budget reduces the big file's plan alone
        cur = big.index("\n", 4000) + 1
        first = e.complete(CompletionRequest(big, cur, path="/w/big.py", layout="efim", max_prompt_ms=150))
        assert first.context["reduced"]
        for i, text in enumerate(small):
            out = e.complete(CompletionRequest(text, len(text) - 1, path=f"/w/f{i}.py", layout="efim",
                                               max_prompt_ms=150))
            assert not out.context["reduced"]
            for _ in range(3):  # idle time between two edits: the big file's growth runs
                try:
                    e.grow("/w/big.py", stop_after(6))
                except Cancelled:
                    pass
            held = {s["path"]: s["tokens"] for s in e.status()["slots"] if s["tokens"]}
            grown = max(grown, held.get("/w/big.py", 0))
            in_use = [f"/w/f{j}.py" for j in range(max(0, i - 2), i + 1)]  # the last 3: 4 slots, one growing
            assert all(p in held for p in in_use), (i, held)
        assert grown > len(first.prompt.tokens)  # growth did run
        e.grow("/w/big.py")  # a quiet spell: it completes
        assert not e.reduced("/w/big.py")
        held = {s["path"] for s in e.status()["slots"] if s["tokens"]}
        assert {"/w/f3.py", "/w/f4.py", "/w/f5.py"} <= held
