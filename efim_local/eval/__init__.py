"""Evaluation: how good the answers are, apart from how fast they come (that is bench/).

- ``quality.py``: HumanEval infilling through the engine's own planner (``efim bench quality``, also
  a part of the bench suite): task loading, greedy answers per layout and healing, exact match,
  pass@1 (the candidate program runs in a subprocess with CPU, memory and time limits), paired
  bootstrap intervals and the report.
- ``results.py``: a run's JSON file and its tables (the benchmarks save theirs the same way).

Layer: just below bench/ (the suite runs the quality part); it uses the engine in-process and never
the training code.
"""
