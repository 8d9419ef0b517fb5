"""SeqIO glue: host-local batches over epochs, with an iterator state that checkpoints.

Each epoch is one pass of `seqio.get_dataset(..., num_epochs=1)` with the seed `seed + epoch`,
so every epoch sees every example of this host's shard once, in a fresh order fixed by the
seed. The iterator's state is two integers (epoch, batches already taken in that epoch);
restoring rebuilds the epoch's pipeline and skips that many batches, which reproduces the
uninterrupted stream exactly because the pipeline is deterministic given its seed.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator

import numpy as np

from t5x_lite.errors import ConfigValueError
from t5x_lite.tf_setup import import_tensorflow


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Which task to read and how to batch it (bound in gin/runs/*.gin).

    Attributes:
      mixture_or_task_name: a registered seqio task or mixture.
      split: dataset split, for example 'train' or 'validation'.
      sequence_length: length of each packed row of targets.
      inputs_length: length of each packed row of inputs (encoder-decoder only).
      feature_converter: 'lm' (seqio.LMFeatureConverter, for decoder-only models) or
        'enc_dec' (seqio.EncDecFeatureConverter, for encoder-decoders); None picks the one
        the model family needs.
      batch_size: global batch size (rows per step over all processes).
      shuffle: shuffle files and examples (with a per-epoch seed).
      pack: pack several examples into each row (segment ids keep them apart).
      seed: data seed; epoch e uses seed + e.
      use_cached: read seqio's offline cache of the task.
    """

    mixture_or_task_name: str
    split: str = "train"
    sequence_length: int = 256
    inputs_length: int | None = None
    feature_converter: str | None = None
    batch_size: int = 8
    shuffle: bool = True
    pack: bool = True
    seed: int = 0
    use_cached: bool = False

    def __post_init__(self):
        if self.feature_converter is not None and self.feature_converter not in FEATURE_CONVERTERS:
            raise ConfigValueError(f"Unknown feature_converter {self.feature_converter!r}; choose one of "
                             f"{list(FEATURE_CONVERTERS)}.")
        if self.feature_converter == "enc_dec" and not self.inputs_length:
            raise ConfigValueError("feature_converter='enc_dec' needs DataConfig.inputs_length (the encoder's "
                             "length); set --gin.INPUTS_LENGTH=... .")

    def for_model_family(self, family: str) -> "DataConfig":
        """This config with the feature converter `family` needs filled in (or checked)."""
        wanted = next(name for name, (_, feeds) in FEATURE_CONVERTERS.items() if feeds == family)
        if self.feature_converter not in (None, wanted):
            raise ConfigValueError(f"The {family} model cannot read {self.split} batches from the "
                             f"{self.feature_converter!r} feature converter; set DataConfig.feature_converter "
                             f"to {wanted!r} (or None).")
        return dataclasses.replace(self, feature_converter=wanted)

    @property
    def converter(self) -> str:
        return self.feature_converter or "lm"

    def task_feature_lengths(self) -> dict[str, int]:
        lengths = {"targets": self.sequence_length}
        if self.converter == "enc_dec":
            lengths["inputs"] = self.inputs_length
        return lengths

    def model_feature_shapes(self, rows: int) -> dict[str, tuple[int, int]]:
        """Shapes of the model's token inputs in a batch of `rows` rows."""
        shapes = {"decoder_input_tokens": (rows, self.sequence_length)}
        if self.converter == "enc_dec":
            shapes["encoder_input_tokens"] = (rows, self.inputs_length)
        return shapes


# Name -> (seqio feature converter class name, the model family it feeds).
FEATURE_CONVERTERS = {
    "lm": ("LMFeatureConverter", "decoder_only"),
    "enc_dec": ("EncDecFeatureConverter", "encoder_decoder"),
}


def get_task(name: str):
    """The registered seqio task or mixture `name`, with the list of known names on a miss."""
    import seqio

    import_tensorflow()
    try:
        return seqio.get_mixture_or_task(name)
    except ValueError:
        known = sorted(seqio.TaskRegistry.names()) + sorted(seqio.MixtureRegistry.names())
        raise ValueError(
            f"No seqio task or mixture named {name!r}. Known: {known}. Register it in a module "
            "and name that module with --gin.MIXTURE_OR_TASK_MODULE=\"'my.module'\"."
        ) from None


def vocabulary_size(config: DataConfig) -> int:
    """Size of the task's `targets` vocabulary."""
    return get_task(config.mixture_or_task_name).output_features["targets"].vocabulary.vocab_size


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
