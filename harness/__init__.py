"""attn-harness: engine-shaped batches, attention backends, and independent references."""

__version__ = "0.1.0"
