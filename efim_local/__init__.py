"""efim-local: a local code-completion engine with EFIM prompts and KV cache reuse."""

__version__ = "0.1.0"
