"""One file, one slot: an edit at the top of a file re-plans it in its own slot."""

from efim_local.engine import CompletionRequest, Engine
from tests.helpers import small_config

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
