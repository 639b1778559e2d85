"""Why an answer's context was cut, and what would help.

A plan is reduced by one thing only, the latency budget (``max_prompt_ms``): its new tokens would
not have been prefilled in time at the speed this machine has learned. The reply says so in
``context.reduced_by``, with the facts that made the budget bind (the budget, the learned speed,
how long the missing context would take, the CPU other processes take) and a one-line ``text`` that
the editors show (Neovim's info line, VS Code's status bar) and the daemon's log names. ``efim
status`` sums the last minute's answers up and says what would help (``help_text``).
"""

from __future__ import annotations

from .policy import Policy

LATENCY_BUDGET = "latency_budget"
SPEED_TOKENS = 1000  # status's prefill speed: tokens per second for a prefill of this many, on an empty slot


def prefill_tok_s(speed, n: int = SPEED_TOKENS, n_ctx: int = 0) -> float | None:
    """The learned prefill speed in tokens per second, for ``n`` new tokens after ``n_ctx``; None
    while it is not known."""
    if not speed.known or n <= 0:
        return None
    return round(n / speed.predict_ms(n, n_ctx) * 1e3, 1)


def reduced_by(speed, cores, budget_ms: float, context: dict) -> dict:
    """The facts behind a reduced plan's ``context`` (its ``tokens`` of ``full_tokens``), with its text:
    an engine's learned ``speed`` and its ``cores`` (engine/cpu.py; None: fixed threads)."""
    used, full = context["tokens"], context["full_tokens"]
    missing = max(0, full - used)
    known = speed.known and missing > 0
    out = {"cause": LATENCY_BUDGET, "budget_ms": budget_ms,
           "prefill_tok_s": prefill_tok_s(speed, missing, used) if known else prefill_tok_s(speed),
           "missing_tokens": missing, "missing_ms": round(speed.predict_ms(missing, used)) if known else None,
           "cores": cores.cores if cores is not None else None,
           "cores_used_by_others": round(cores.others, 2) if cores is not None else None}
    out["text"] = cause_text(out)
    return out


def seconds(ms: float) -> str:
    """'850 ms', '8.3 s', '42 s'."""
    return f"{ms:.0f} ms" if ms < 1000 else f"{ms / 1e3:.1f} s" if ms < 10_000 else f"{ms / 1e3:.0f} s"


def others_text(others: float | None, cores: int | None) -> str | None:
    """'other processes use 1.0 of 2 cores', when they take enough to count (else None)."""
    if others is None or not cores or others < Policy.cores_taken / 3:
        return None
    return f"other processes use {others:.1f} of {cores} cores"


def cause_text(r: dict) -> str:
    """One line (editors, the log): 'latency budget 300 ms; the other 2900 tokens need 8.3 s at 351
    tok/s; other processes use 1.0 of 2 cores'."""
    if not r.get("budget_ms"):
        text = "an earlier latency budget (idle time grows it back)"
    else:
        text = f"latency budget {r['budget_ms']:g} ms"
    if r.get("missing_ms") is not None:
        text += f"; the other {r['missing_tokens']} tokens need {seconds(r['missing_ms'])}"
        if r.get("prefill_tok_s"):
            text += f" at {r['prefill_tok_s']:.0f} tok/s"
    busy = others_text(r.get("cores_used_by_others"), r.get("cores"))
    return text + (f"; {busy}" if busy else "")


def help_text(st: dict, minute: dict | None = None) -> str:
    """What would give the answers more context, from an engine's status ``st`` (its budget, learned
    speed and the CPU other processes take) and the last minute's answers (``minute``: requests,
    reduced); a sentence for ``efim status``."""
    budget, tok_s = st.get("max_prompt_ms"), st.get("prefill_tok_s")
    reduced = None if minute is None else minute.get("reduced", 0)  # None: no answers known (in-process)
    if budget == 0:
        return "nothing: the latency budget is off (max_prompt_ms = 0)" + (
            "; idle time grows the plans it cut before" if reduced else "")
    if reduced == 0:
        return ("nothing: no answer in the last minute was reduced" if minute.get("requests")
                else "no answer in the last minute")
    parts = []
    busy = others_text(st.get("cores_used_by_others"), st.get("cores"))
    if busy:
        parts.append(f"fewer other processes ({busy})")
    if budget:
        n = st.get("budget_tokens")
        fits = f", about {n} new tokens at {tok_s:.0f} tok/s" if tok_s and n else ""
        parts.append(f"a larger max_prompt_ms (now {budget:g} ms{fits})")
    if not busy and tok_s:
        parts.append("a smaller model")
    parts.append("pauses in typing (idle time grows the context back)")
    return "; ".join(parts)
