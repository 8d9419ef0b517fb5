"""Metrics: the arithmetic of training and evaluation numbers, and where they are written.

Owns:
  arithmetic.py  pure functions: tokens per second, MFU, perplexity, per-token train metrics
  writer.py      `MetricsWriter`: TensorBoard scalars under MODEL_DIR/tb/ and a progress bar on stdout

Public names: `arithmetic.tokens_per_second`, `model_flops_utilization`, `perplexity`,
`summarize_train_metrics`; `writer.MetricsWriter`.

May import (pyproject.toml's layers contract): models, storage, errors, tf_setup. Not parallel,
its sibling on the same layer.
"""
