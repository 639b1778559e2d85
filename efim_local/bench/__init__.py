"""Benchmarks behind ``efim bench``: the paper's rounds, state restores, and an edit-trace replay
against llama-server. Scripts in ``scripts/`` and the CLI are thin layers over these modules."""
