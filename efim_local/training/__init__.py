"""Building models: corpus, BPE, fragment tokenization, the PyTorch model, GGUF writing and
conversion, the tiny test model. Serving code never imports this package."""
