"""Why an answer's context was cut and what would help (issue 39): the texts the editors, the log and
``efim status`` show, and the last minute's count of reduced answers."""

import logging

from efim_local.daemon import logs
from efim_local.engine.reduction import cause_text, help_text, seconds

FACTS = {"cause": "latency_budget", "budget_ms": 300.0, "prefill_tok_s": 351.2, "missing_tokens": 2900,
         "missing_ms": 8260, "cores": 2, "cores_used_by_others": 1.04}


def test_the_cause_names_the_budget_the_missing_context_its_time_and_the_busy_cpu():
    assert cause_text(FACTS) == ("latency budget 300 ms; the other 2900 tokens need 8.3 s at 351 tok/s; "
                                 "other processes use 1.0 of 2 cores")


def test_a_quiet_machine_is_not_named_nor_an_unknown_speed():
    quiet = {**FACTS, "cores_used_by_others": 0.1}
    assert cause_text(quiet) == "latency budget 300 ms; the other 2900 tokens need 8.3 s at 351 tok/s"
    assert cause_text({**quiet, "missing_ms": None, "cores": None}) == "latency budget 300 ms"
    # a plan a budget cut earlier, asked for without one: growth has not finished yet
    assert cause_text({**quiet, "budget_ms": 0.0}).startswith("an earlier latency budget (idle time grows it back);")


def test_seconds():
    assert [seconds(v) for v in (12.4, 999, 8260, 42_000)] == ["12 ms", "999 ms", "8.3 s", "42 s"]


STATUS = {"max_prompt_ms": 300.0, "prefill_tok_s": 351.2, "budget_tokens": 105, "cores": 2,
          "cores_used_by_others": 1.04}


def test_help_on_a_busy_machine_names_the_other_processes_first():
    assert help_text(STATUS, {"requests": 12, "reduced": 9}) == (
        "fewer other processes (other processes use 1.0 of 2 cores); a larger max_prompt_ms (now 300 ms, about "
        "105 new tokens at 351 tok/s); pauses in typing (idle time grows the context back)")


def test_help_on_a_quiet_machine_suggests_a_smaller_model():
    text = help_text({**STATUS, "cores_used_by_others": 0.0}, {"requests": 12, "reduced": 9})
    assert text.startswith("a larger max_prompt_ms (now 300 ms") and "; a smaller model;" in text


def test_help_when_nothing_was_cut():
    assert help_text(STATUS, {"requests": 5, "reduced": 0}) == "nothing: no answer in the last minute was reduced"
    assert help_text(STATUS, {"requests": 0}) == "no answer in the last minute"
    off = {**STATUS, "max_prompt_ms": 0.0}
    assert help_text(off, {"requests": 5, "reduced": 0}) == "nothing: the latency budget is off (max_prompt_ms = 0)"
    assert help_text(off, {"requests": 5, "reduced": 1}).startswith("nothing: the latency budget is off")


def answer(share: float, reduced: bool, why: str | None = None) -> dict:
    ctx = {"tokens": int(share * 1000), "full_tokens": 1000, "share": share, "reduced": reduced}
    if why:
        ctx["reduced_by"] = {"cause": "latency_budget", "text": why}
    return {"tokens": {"cached": 0, "evaluated": 5, "generated": 2, "prompt": 5}, "timings": {"total_ms": 3.0},
            "layout": "efim", "cache_tier": "none", "reanchor": None, "context": ctx}


def test_the_last_minute_counts_the_reduced_answers_and_forgets_older_ones(monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(logs.time, "monotonic", lambda: clock[0])
    stats = logs.RequestStats()
    stats.record("/a.py", answer(0.1, True, "latency budget 300 ms"))
    clock[0] += 50
    stats.record("/a.py", answer(0.5, True, "latency budget 300 ms"))
    stats.record("/a.py", answer(1.0, False))
    assert stats.summary()["context"]["last_minute"] == {"requests": 3, "reduced": 2, "mean_share": 0.533}
    clock[0] += 20  # the first is older than a minute now
    assert stats.summary()["context"]["last_minute"] == {"requests": 2, "reduced": 1, "mean_share": 0.75}
    clock[0] += 100
    assert stats.summary()["context"]["last_minute"] == {"requests": 0, "reduced": 0, "mean_share": None}
    assert stats.summary()["context"]["reduced"] == 0.667  # the window of the last requests keeps them


def test_the_log_line_names_the_cause(caplog):
    stats = logs.RequestStats()
    with caplog.at_level(logging.INFO, logger="efim.daemon"):
        stats.record("/a.py", answer(0.1, True, "latency budget 300 ms; other processes use 1.0 of 2 cores"))
        stats.record("/a.py", answer(1.0, False))
    reduced, full = [r.getMessage() for r in caplog.records if r.getMessage().startswith("complete ")]
    assert reduced.endswith(" ms; reduced by latency budget 300 ms; other processes use 1.0 of 2 cores"), reduced
    assert "reduced" not in full and full.endswith(" ms"), full
