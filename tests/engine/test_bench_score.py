"""The context benchmark's scorer: a warm (KV-reusing) score equals a cold token-by-token decode."""

import math

import pytest

from efim_local.bench.score import Scorer, log_softmax
from efim_local.config import ContextParams
from efim_local.llama import Batch, Context, Model


def cold_logprobs(path, prompt, target):
    """Decode ``prompt`` and then one target token at a time in a fresh context: the reference."""
    with Model(path) as m, Context(m, ContextParams(n_ctx_seq=512, n_slots=1, n_threads=1,
                                                   n_threads_batch=1)) as ctx, Batch(512) as b:
        for p, t in enumerate(prompt):
            b.add(t, p, 0, logits=p == len(prompt) - 1)
        ctx.decode(b)
        out, row = [], len(prompt) - 1
        for k, t in enumerate(target):
            out.append(float(log_softmax(ctx.logits(row))[t]))
            b.clear()
            row = b.add(t, len(prompt) + k, 0, logits=True)
            ctx.decode(b)
        return out


@pytest.mark.parametrize("fixture", ["tiny_model", "tiny_model_swa"])
def test_warm_scores_equal_a_cold_decode(fixture, request):
    path = request.getfixturevalue(fixture)
    head = "import os\n\ndef read(path):\n    with open(path) as f:\n        return f.read()\n\n" * 3
    with Scorer(path, n_ctx=512, threads=1, n_batch=64) as s:  # batches smaller than the prompts
        cases = [(head + "def write(path, text):\n    with open(", "path, 'w') as f:"),
                 (head + "def write(path, text):\n    with open(path", ", 'w') as f:"),  # shares the head
                 ("x = 1\n", "y = 2"),  # shares nothing
                 (head + "def write(path, text):\n    with open(", "path, 'w') as f:")]
        for prompt_text, target_text in cases:
            prompt, target = s.tokenize(prompt_text), s.tokenize(target_text)
            warm = s.logprobs(prompt, target)
            cold = cold_logprobs(path, prompt, target)
            assert len(warm) == len(target)
            assert warm == pytest.approx(cold, abs=1e-3)
            before = s.evaluated
            assert s.bits(prompt, target) == pytest.approx(-sum(cold) / math.log(2), abs=1e-3)
            assert s.evaluated - before == len(target) + 1  # the same again: only the last prompt token


def test_sequences_keep_their_own_cells(tiny_model_swa):
    """Two kinds of prompts alternate, each in its sequence: each reuses its own previous prompt."""
    head = "import os\n\ndef read(path):\n    with open(path) as f:\n        return f.read()\n\n" * 3
    with Scorer(tiny_model_swa, n_ctx=512, threads=1, n_seqs=2) as s:
        a, b = s.tokenize(head + "def a("), s.tokenize("x = 1\n" * 20 + "y =")
        t = s.tokenize(" path):")
        first = [s.logprobs(a, t, 0), s.logprobs(b, t, 1)]
        before = s.evaluated
        again = [s.logprobs(a, t, 0), s.logprobs(b, t, 1)]
        assert s.evaluated - before == 2 * (len(t) + 1)
        assert again == first and first[0] == pytest.approx(cold_logprobs(tiny_model_swa, a, t), abs=1e-3)
        assert first[1] == pytest.approx(cold_logprobs(tiny_model_swa, b, t), abs=1e-3)


def test_too_long_or_empty_is_refused(tiny_model):
    with Scorer(tiny_model, n_ctx=64, threads=1) as s:
        with pytest.raises(ValueError):
            s.logprobs([1] * (s.n_ctx - 5), [2] * 10)
        with pytest.raises(ValueError):
            s.logprobs([], [2])


def test_fim_form_puts_both_sides_in_the_scorers_fim_tokens(tiny_model, tiny_model_nofim):
    from efim_local.bench.context import prompt_tokens

    with Scorer(tiny_model, n_ctx=256, threads=1) as s:
        fim = s.model.fim_ids()
        left, right = "def f(x):\n    return " * 20, "\n\nprint(f(2))\n" * 20
        p = prompt_tokens(s, left, right, "fim", 100)
        assert len(p) <= 100 and p[len(s.model.bos)] == fim["pre"] and p[-1] == fim["mid"]
        i = p.index(fim["suf"])
        assert s.model.detokenize(p[len(s.model.bos) + 1:i]) in left  # the far ends were cut
        assert s.model.detokenize(p[i + 1:-1]) in right
        assert prompt_tokens(s, left, right, "left", 100)[-5:] == s.tokenize(left)[-5:]
    with Scorer(tiny_model_nofim, n_ctx=256, threads=1) as s, pytest.raises(ValueError, match="no FIM"):
        prompt_tokens(s, left, right, "fim", 100)


def test_a_plans_texts_are_rebuilt_from_its_counts(tiny_model):
    from efim_local.bench.context import Texts

    doc = "".join(f"def f{i}(x):\n    return x + {i}\n\n" for i in range(200))
    cursor = doc.index("def f150")
    t = Texts(tiny_model, 4096)
    try:
        lt, rt = t.model.tokenize(doc[:cursor]), t.model.tokenize(doc[cursor:])
        # A reduced plan: 100 from the top, a gap, 200 near the cursor
        left, right = t.texts(doc, cursor, 300, 50, head=100, gap=len(lt) - 300)
        assert left == t.model.detokenize(lt[:100]) + t.model.detokenize(lt[-200:])
        assert right == t.model.detokenize(rt[:50]) and doc.startswith(left[:200])
        # ...or 100 from a near window: 50 dropped between them and the 200 nearest
        near = t.texts(doc, cursor, 300, 0, head=100, gap=50)[0]
        assert near == t.model.detokenize(lt[-350:-250]) + t.model.detokenize(lt[-200:])
        assert t.texts(doc, cursor, 300, 0) == (t.model.detokenize(lt[-300:]), "")
        assert t.texts(doc, cursor, len(lt) + 5, 0, head=50)[0] == doc[:cursor]  # more than there is: all
        full_left, full_right = t.counts_full(doc, cursor)
        assert full_left + full_right <= 4096 and full_left >= 0.9 * len(lt)
    finally:
        t.close()
