"""InfiniGen (OSDI'24) on llama.cpp: speculate which KV cells matter and restore only those.

- ``capture``: post-RoPE Q and K of every layer, through the context's eval callback.
- ``skew``: per-layer, per-KV-head skewing matrices from a calibration run (a sidecar npz).
- ``sparse``: the engine's opt-in mode (partial keys saved beside states, shrinking, fallbacks).
- ``select``: selection policies (InfiniGen, its no-skew ablation, an attention oracle, recency,
  sinks + recency) that turn scores into the cells to keep under a budget.
- ``restore``: the request-time path: rehearse the tail, select, restore the subset, decode.
"""
