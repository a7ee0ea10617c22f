"""The model-level check: tiny HF models served step by step over a paged cache."""
