"""Metrics: the arithmetic of training and evaluation numbers, and where they are written.

Owns:
  arithmetic.py     pure functions: tokens per second, MFU, perplexity, per-token train metrics
  writer.py         `MetricsWriter`: a run's scalars to its metric writers, a progress bar on stdout
  background.py     `BackgroundSink`: a remote writer's sink on a thread of its own (a bounded queue,
                    drops counted, a close that waits seconds at most), so no backend holds the loop
  tracking.py       the writer specs bound in gin (`MetricWriter`, `TensorBoardWriter`), `check_writers`
                    (up front: a missing package is one `MissingExtraError`), the tracked run's id
                    under MODEL_DIR/tracking/, the run's gin config as a flat {binding: value}
  wandb_writer.py   `WandbWriter`: Weights & Biases, offline or online (imports wandb only when used)
  mlflow_writer.py  `MlflowWriter`: MLflow through `MlflowClient` (imports mlflow only when used)

Public names: `arithmetic.tokens_per_second`, `model_flops_utilization`, `perplexity`,
`summarize_train_metrics`; `writer.MetricsWriter`, `writer.DEFAULT_WRITERS`; `background.BackgroundSink`;
`tracking.MetricWriter`, `TensorBoardWriter`, `RunInfo`, `Sink`, `check_writers`, `bad_writers`,
`flat_config`, `TrackingError`; `wandb_writer.WandbWriter`; `mlflow_writer.MlflowWriter`,
`mlflow_writer.params_to_log`.

May import (pyproject.toml's layers contract): models, storage, errors, tf_setup. Not parallel,
its sibling on the same layer. wandb and mlflow are optional (`make install-tracking`).
"""
