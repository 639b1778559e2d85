"""GGUF metadata keys of this project's own: the trainer writes them (training/gguf_llama.py), the
engine and the model catalog read them (engine/models.py, catalog.py). Namespaced under ``efim.``
so that other tools ignore them."""

KEY_FRAGMENT = "efim.fragment_trained"  # "true": trained with fragment tokenization
KEY_LAYOUT = "efim.layout"  # the prompt layout the model was trained for
