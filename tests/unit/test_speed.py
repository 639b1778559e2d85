"""The prefill speed model behind the latency budget (fitted from observations; no model)."""

import pytest

from efim_local.engine.speed import PrefillSpeed


def test_speed_model_learns_per_token_and_context_costs():
    s = PrefillSpeed()
    assert not s.known and s.max_new(100) > 1e6  # unknown: no limit
    for n, c in ((64, 0), (192, 64), (100, 1000), (300, 2000)):
        s.observe(n, c, n * (2.0 + 0.001 * (c + n / 2)))
    assert s.a == pytest.approx(2.0, rel=1e-6) and s.b == pytest.approx(0.001, rel=1e-6)
    n = s.max_new(500, 1000)
    assert s.predict_ms(n, 1000) <= 500 < s.predict_ms(n + 1, 1000)
