"""t5x_lite: a small, complete T5X-style trainer for sequence models in JAX."""
