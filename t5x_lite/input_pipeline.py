"""Host-local batches over epochs, with an iterator state that checkpoints."""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np

from t5x_lite.data import FEATURE_CONVERTERS, DataConfig
from t5x_lite.tf_setup import import_tensorflow


def epoch_dataset(config: DataConfig, *, epoch: int, host_batch_size: int, shard_index: int,
                  num_shards: int):
    """One epoch of this host's shard as a tf.data.Dataset of batched model features."""
    import seqio

    tf = import_tensorflow()
    dataset = seqio.get_dataset(
        config.mixture_or_task_name,
        task_feature_lengths=config.task_feature_lengths(),
        feature_converter=getattr(seqio, FEATURE_CONVERTERS[config.converter][0])(pack=config.pack),
        dataset_split=config.split,
        use_cached=config.use_cached,
        shuffle=config.shuffle,
        num_epochs=1,
        shard_info=seqio.ShardInfo(index=shard_index, num_shards=num_shards),
        seed=config.seed + epoch if config.shuffle else None,
        verbose=False,
    )
    return dataset.batch(host_batch_size, drop_remainder=False).prefetch(tf.data.AUTOTUNE)


def _pad_rows(batch: dict[str, np.ndarray], rows: int) -> dict[str, np.ndarray]:
    """Pads the short final batch of an epoch with all-zero rows (zero loss weight)."""
    missing = rows - next(iter(batch.values())).shape[0]
    if missing == 0:
        return batch
    return {k: np.concatenate([v, np.zeros((missing, *v.shape[1:]), v.dtype)]) for k, v in batch.items()}


class BatchIterator:
    """Host-local numpy batches over `num_epochs` epochs (None: forever), checkpointable.

    `epoch` and `batches_in_epoch` are the whole state; `end_of_epoch` is True right after
    the last batch of an epoch was returned.
    """

    def __init__(self, config: DataConfig, *, num_epochs: int | None, host_batch_size: int,
                 shard_index: int = 0, num_shards: int = 1):
        self.config = config
        self.num_epochs = num_epochs
        self.host_batch_size = host_batch_size
        self.shard_index = shard_index
        self.num_shards = num_shards
        self.epoch = 0
        self.batches_in_epoch = 0
        self.end_of_epoch = False
        self._it: Iterator[dict[str, np.ndarray]] | None = None
        self._pending: dict[str, np.ndarray] | None = None

    def _open(self) -> None:
        dataset = epoch_dataset(self.config, epoch=self.epoch, host_batch_size=self.host_batch_size,
                                shard_index=self.shard_index, num_shards=self.num_shards)
        self._it = dataset.skip(self.batches_in_epoch).as_numpy_iterator()

    def __iter__(self) -> "BatchIterator":
        return self

    def _fetch(self) -> dict[str, np.ndarray] | None:
        if self._it is None:
            self._open()
        return next(self._it, None)

    def __next__(self) -> dict[str, np.ndarray]:
        if self.num_epochs is not None and self.epoch >= self.num_epochs:
            raise StopIteration
        batch = self._pending if self._pending is not None else self._fetch()
        if batch is None:
            raise ValueError(
                f"Split {self.config.split!r} of {self.config.mixture_or_task_name!r} yields no "
                f"examples for shard {self.shard_index} of {self.num_shards}; add data or use fewer shards."
            )
        self.batches_in_epoch += 1
        # Look one batch ahead so the caller learns at once that this batch ended the epoch.
        self._pending = self._fetch()
        self.end_of_epoch = self._pending is None
        if self.end_of_epoch:
            self.epoch, self.batches_in_epoch, self._it = self.epoch + 1, 0, None
        return _pad_rows(dict(batch), self.host_batch_size)

    def get_state(self) -> dict[str, Any]:
        """A small JSON-able state: restoring it resumes the exact same stream."""
        return {"epoch": self.epoch, "batches_in_epoch": self.batches_in_epoch,
                "shard_index": self.shard_index, "num_shards": self.num_shards}

    def set_state(self, state: dict[str, Any]) -> None:
        if (state["shard_index"], state["num_shards"]) != (self.shard_index, self.num_shards):
            raise ValueError(
                f"Iterator state is for shard {state['shard_index']} of {state['num_shards']}, "
                f"but this process reads shard {self.shard_index} of {self.num_shards}."
            )
        self.epoch, self.batches_in_epoch = int(state["epoch"]), int(state["batches_in_epoch"])
        self.end_of_epoch, self._it, self._pending = False, None, None
