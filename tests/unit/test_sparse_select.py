"""InfiniGen cell selection (efim_local.kv.sparse.select.choose) on synthetic scores."""

import numpy as np

from efim_local.kv.sparse import select
from efim_local.kv.sparse.select import SelectConfig


def test_choose_keeps_sinks_recent_and_the_budget():
    pos = np.random.default_rng(0).permutation(1000).astype(np.int32)
    scores = -np.abs(np.random.default_rng(1).normal(0, 3, 1000))
    for policy in select.POLICIES:
        cfg = SelectConfig(budget=0.2, sinks=4, recent=32, policy=policy)
        keep = select.choose(pos, cfg, scores if policy in ("infinigen", "noskew", "oracle") else None)
        kept = np.sort(pos[keep])
        assert keep.sum() <= 200
        if policy == "recency":
            assert np.array_equal(kept, np.arange(800, 1000))
            continue
        assert set(range(4)) <= set(kept) and set(range(968, 1000)) <= set(kept)
        if policy == "sinks+recency":
            assert keep.sum() == 200
        else:  # the rest is the best-scoring cells within max - alpha
            rest = keep & (pos >= 4) & (pos < 968)
            others = ~keep & (pos >= 4) & (pos < 968)
            assert (scores[rest] >= -4).all() and scores[rest].min() >= scores[others & (scores >= -4)].max(initial=-99)
    # Ranked by another key (attention mass): the best of it among the cells within max - alpha.
    mass = np.random.default_rng(2).random(1000)
    keep = select.choose(pos, SelectConfig(budget=0.2, sinks=4, recent=32), scores, mass)
    rest, others = keep & (pos >= 4) & (pos < 968), ~keep & (pos >= 4) & (pos < 968) & (scores >= -4)
    assert keep.sum() == 200 and mass[rest].min() >= mass[others].max()
    assert not np.array_equal(keep, select.choose(pos, SelectConfig(budget=0.2, policy="recency")))
