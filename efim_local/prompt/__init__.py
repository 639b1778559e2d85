"""Pure prompt building: documents and cursors, FIM templates, the EFIM planner, token healing.

Nothing here imports llama.cpp; the tokenizer is passed in."""
