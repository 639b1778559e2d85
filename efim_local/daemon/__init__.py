"""The daemon: one model for every editor, over a Unix socket (JSON-RPC 2.0, one object per line).

server (socket, peers) → framing (lines ↔ messages) → dispatch (→ handler, errors → replies)
→ handlers (methods) → worker (the engine thread). documents, watcher and client are helpers.
"""
