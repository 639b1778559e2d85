"""`efim bench`'s FIM-token copy of a GGUF: the same weights and tokenizer, new FIM token ids."""

import numpy as np

from efim_local.bench.fim_copy import with_fim_tokens
from efim_local.llama import Batch, Context, ContextParams, Model


def test_fim_token_copy_keeps_the_weights(tiny_model_nofim, tmp_path):
    dst = with_fim_tokens(tiny_model_nofim, tmp_path / "fim.gguf", ids=[5, 6, 7])
    with Model(tiny_model_nofim) as a, Model(dst) as b:
        assert not a.fim_ids() and b.fim_ids() == {"pre": 5, "suf": 6, "mid": 7}
        ids = a.tokenize("def add(a, b):\n    return a + b\n")
        assert ids == b.tokenize("def add(a, b):\n    return a + b\n")
        logits = []
        for m in (a, b):
            with Context(m, ContextParams(n_ctx_seq=128, n_slots=1)) as ctx, Batch(128) as batch:
                for i, t in enumerate(ids):
                    batch.add(t, i, 0, logits=i == len(ids) - 1)
                ctx.decode(batch)
                logits.append(np.array(ctx.logits(len(ids) - 1)))
        assert np.array_equal(*logits)
