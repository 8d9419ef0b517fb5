"""The validation loss of the train loop."""

from __future__ import annotations

from typing import Any

from t5x_lite.data import iterators
from t5x_lite.data.task_access import DataConfig
from t5x_lite.errors import RunConfigError
from t5x_lite.metrics import arithmetic as metric_math
from t5x_lite.parallel import partitioning
from t5x_lite.training import trainer as trainer_lib


def validation_loss(trainer: trainer_lib.Trainer, params: Any, config: DataConfig, *,
                    max_batches: int | None = None) -> dict[str, float]:
    """Mean per-token cross entropy and perplexity over the split (or its first max_batches).

    One deterministic pass: no shuffle, the last partial batch padded with zero-weight rows,
    so the result does not depend on the batch size.
    """
    shard, num_shards, host_batch = partitioning.process_data_shard(trainer.batch_sharding, config.batch_size)
    iterator = iterators.build(config, num_epochs=1, host_batch_size=host_batch, shard_index=shard,
                               num_shards=num_shards, validation=True).iterator
    totals = {"loss_sum": 0.0, "weight_sum": 0.0}
    try:
        for i, batch in enumerate(iterator):
            if max_batches is not None and i >= max_batches:
                break
            sums = trainer.eval_step(params, trainer.place_batch(batch))
            for k in totals:
                totals[k] += float(sums[k])
    finally:
        iterator.close()
    if totals["weight_sum"] == 0:
        raise RunConfigError(f"The {config.split} split of {config.mixture_or_task_name!r} is empty; "
                             "prepare it with a validation fraction > 0.")
    loss = totals["loss_sum"] / totals["weight_sum"]
    return {"loss": loss, "perplexity": metric_math.perplexity(loss), "tokens": totals["weight_sum"]}

