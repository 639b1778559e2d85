"""The background daemon: a Unix-socket JSON-RPC API for editors over one engine."""
