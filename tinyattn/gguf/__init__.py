"""GGUF files for llama.cpp: `writer` (metadata and tensors), `vocab` (the tokenizer)."""
