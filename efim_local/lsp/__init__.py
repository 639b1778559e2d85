"""``efim lsp``: a language server (LSP 3.18 inline completion) that relays to the shared daemon.

pygls is imported only when the server runs (``server.py``), so other commands stay fast.
"""
