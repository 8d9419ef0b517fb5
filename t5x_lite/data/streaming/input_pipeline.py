"""Host-local batches over exact epochs, with an iterator state of a few integers.

An epoch is one pass of the task's split, read through seqio with `num_epochs=1` and a seed
derived from (data seed, epoch): every example of this data shard is seen exactly once per
epoch, files and examples in a fresh order that the seed fixes. seqio's `ShardInfo` gives each
data shard (a process, or a group of processes holding the same batch rows) its own files.

Checkpointing: the state is (epoch, batches taken in the epoch, the epoch's planned length,
the shard). Restoring rebuilds the epoch's pipeline and skips the batches already taken, which
reproduces the uninterrupted stream exactly because the pipeline is a deterministic function
of its seed (seqio seeds the stateful random preprocessors from it). The state does not grow
with shuffle buffers, unlike a `tf.train.Checkpoint` of the tf.data iterator; the price is a
restore time linear in the position within the epoch (see docs/data.md for figures).

Planned epochs: packing makes the number of rows depend on the data and its order, so data
shards end an epoch after different numbers of batches. When `plan_epochs` is on, each shard
counts its batches for the epoch (a pass of the same pipeline, run ahead in a background
thread), the shards agree on the largest count, and a shard that runs out pads with empty
rows (zero loss weight). Every process then takes the same number of steps per epoch, and a
step's batches over all shards are exactly one global batch with no example read twice.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import math
import re
import threading
from typing import Any, Callable, Iterator

import numpy as np

from t5x_lite.data.records import tfrecord_stream
from t5x_lite.data.task_access import DataConfig, check_cached, get_task
from t5x_lite.errors import UserError
from t5x_lite.tf_setup import import_tensorflow


class EmptySplitError(UserError, ValueError):
    """The split yields no examples for any data shard."""


class MissingSplitError(UserError, ValueError):
    """The task or mixture has no such split."""


class DataReadError(UserError, ValueError):
    """Reading the data failed (a malformed record, an unreadable file); the message says where."""


@contextlib.contextmanager
def _reading(config: DataConfig):
    """Turns TensorFlow's errors from reading records into a DataReadError naming the split (and,
    for a damaged TFRecord, the file)."""
    tf = import_tensorflow()
    try:
        yield
    except (tf.errors.InvalidArgumentError, tf.errors.NotFoundError, tf.errors.DataLossError) as e:
        where = f"split {config.split!r} of {config.mixture_or_task_name!r}"
        damaged = re.search(r"(?:corrupted|truncated) record at (\d+)", e.message)
        found = damaged and tfrecord_stream.find_damaged(_split_files(config), int(damaged.group(1)))
        if found:
            raise DataReadError(f"Reading {where} failed: {found[0]} is damaged ({found[1]}); prepare the data "
                                "again (t5x-lite prepare) or restore the file.") from None
        raise DataReadError(f"Reading {where} failed: {root_message(e.message)}") from None


def _split_files(config: DataConfig) -> list[str]:
    """The files the split reads, over every task of a mixture (those of file-based sources)."""
    provider = get_task(config.mixture_or_task_name)
    files = []
    for task in getattr(provider, "tasks", [provider]):
        try:
            files.extend(task.source.list_shards(config.split))
        except Exception:  # noqa: BLE001 - a source without files (or without the split) has none to check
            continue
    return files


def root_message(text: str) -> str:
    """The Python error inside a TensorFlow error message (a py_func's traceback), else its first line."""
    raised = re.findall(r"^[\w.]*(?:Error|Exception): (.+)$", text, flags=re.MULTILINE)
    return raised[-1].strip() if raised else text.strip().splitlines()[0]


def epoch_seed(seed: int, epoch: int, shard_index: int = 0) -> int:
    """The seed of one data shard's epoch: independent streams for every (seed, epoch, shard).

    (seed + epoch would make epoch 1 of seed 0 replay epoch 0 of seed 1.) Each shard needs its
    own: seqio seeds the random preprocessors (span corruption's noise) from it, and one seed
    for all would give the i-th example of every shard the same draws. Shard 0 keeps the
    (seed, epoch) stream, so a single-process run reads what it always did.
    """
    entropy = [seed, epoch] if shard_index == 0 else [seed, epoch, shard_index]
    return int(np.random.SeedSequence(entropy).generate_state(1, np.uint32)[0] >> 1)


class PipelineStats:
    """Counts of what one epoch's pipeline read: examples, and examples cut to the feature lengths."""

    def __init__(self, features: list[str]):
        tf = import_tensorflow()
        self.examples = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.truncated = {k: tf.Variable(0, dtype=tf.int64, trainable=False) for k in features}

    def as_dict(self) -> dict[str, int]:
        counts = {"examples": int(self.examples.numpy())}
        counts.update({f"truncated_{k}": int(v.numpy()) for k, v in self.truncated.items()})
        return counts


def _trim_and_count(dataset, lengths: dict[str, int], stats: PipelineStats):
    """Cuts each feature to its length, counting the examples that were longer."""
    tf = import_tensorflow()

    def trim(example):
        stats.examples.assign_add(1)
        example = dict(example)
        for key, length in lengths.items():
            stats.truncated[key].assign_add(tf.cast(tf.size(example[key]) > length, tf.int64))
            example[key] = example[key][:length]
        return example

    return dataset.map(trim, num_parallel_calls=tf.data.AUTOTUNE)


def epoch_rows(config: DataConfig, *, epoch: int, shard_index: int, num_shards: int,
               stats: PipelineStats | None = None):
    """One epoch of one data shard as a tf.data.Dataset of model-feature rows (unbatched)."""
    provider = get_task(config.mixture_or_task_name)  # or the extra to install, without seqio
    tf = import_tensorflow()
    import seqio  # seqio and TensorFlow load in seconds: imported where first needed

    lengths = config.seqio_lengths()
    if config.split not in provider.splits:
        raise MissingSplitError(
            f"{config.mixture_or_task_name!r} has no split {config.split!r}; its splits are "
            f"{sorted(provider.splits)}. Set DataConfig.split (train/DataConfig.split or eval/DataConfig.split).")
    if config.use_cached:
        check_cached(provider)  # one line naming the cache command, not seqio's assertion
    dataset = provider.get_dataset(
        sequence_length=lengths,
        split=config.split,
        use_cached=config.use_cached,
        shuffle=config.shuffle,
        # Seeded even unshuffled: random preprocessors (span corruption, prefix split points)
        # then draw the same way on every pass, so evaluations repeat exactly.
        seed=epoch_seed(config.seed, epoch, shard_index),
        shard_info=seqio.ShardInfo(index=shard_index, num_shards=num_shards),
        num_epochs=1,
        trim_output_features=False,
    )
    dataset = _trim_and_count(dataset, lengths, stats or PipelineStats(list(lengths)))
    from t5x_lite.data.streaming import feature_converters  # seqio's converters: imported with seqio

    converter = feature_converters.feature_converter(
        config.converter, pack=config.pack, vocabulary=provider.output_features["targets"].vocabulary)
    return converter(dataset, lengths).prefetch(tf.data.AUTOTUNE)


def epoch_dataset(config: DataConfig, *, epoch: int, host_batch_size: int, shard_index: int,
                  num_shards: int, stats: PipelineStats | None = None):
    """One epoch of one data shard in batches of `host_batch_size` rows (the last may be short)."""
    tf = import_tensorflow()
    rows = epoch_rows(config, epoch=epoch, shard_index=shard_index, num_shards=num_shards, stats=stats)
    return rows.batch(host_batch_size, drop_remainder=False).prefetch(tf.data.AUTOTUNE)


class CountCancelled(Exception):
    """A background count was stopped because its iterator was closed."""


def count_batches(config: DataConfig, *, epoch: int, host_batch_size: int, shard_index: int,
                  num_shards: int, cancel: threading.Event | None = None) -> tuple[int, dict[str, int]]:
    """(batches in this shard's epoch, the epoch's PipelineStats counts), by one pass.

    Setting `cancel` stops the pass within one block of rows (CountCancelled): a run that ends
    mid-epoch must not wait for the next epoch's count before its process can exit.
    """
    tf = import_tensorflow()
    stats = PipelineStats(list(config.seqio_lengths()))
    rows = epoch_rows(config, epoch=epoch, shard_index=shard_index, num_shards=num_shards, stats=stats)
    # Counted in blocks of rows: a step per row costs more than building the rows.
    block_sizes = rows.batch(1024).map(lambda b: tf.shape(next(iter(b.values())), out_type=tf.int64)[0])
    num_rows = 0
    with _reading(config):
        for size in block_sizes.as_numpy_iterator():
            if cancel is not None and cancel.is_set():
                raise CountCancelled()
            num_rows += int(size)
    return math.ceil(num_rows / host_batch_size), stats.as_dict()


def max_over_processes(epoch: int, local_steps: int) -> int:
    """The largest of every process's step count for `epoch` (a collective when multi-process)."""
    import jax  # jax loads in seconds: imported where first needed, so commands that need no device start fast

    if jax.process_count() == 1:
        return local_steps
    # jax loads in seconds: imported where first needed, so commands that need no device start fast
    from jax.experimental import multihost_utils

    return int(np.max(multihost_utils.process_allgather(np.asarray(local_steps, np.int64))))


def _pad_rows(batch: dict[str, np.ndarray], rows: int) -> dict[str, np.ndarray]:
    """Pads a short batch with all-zero rows (zero loss weight)."""
    missing = rows - next(iter(batch.values())).shape[0]
    if missing == 0:
        return batch
    return {k: np.concatenate([v, np.zeros((missing, *v.shape[1:]), v.dtype)]) for k, v in batch.items()}


class BatchIterator:
    """Host-local numpy batches over `num_epochs` epochs (None: forever), checkpointable.

    With `plan_epochs`, every epoch's length in steps is counted before it starts and agreed
    across data shards with `agree_on_steps(epoch, local_steps)` (default: the maximum over
    processes); without it, the end of an epoch is found by reading one batch ahead.
    `end_of_epoch` is True right after the last batch of an epoch was returned.
    """

    def __init__(self, config: DataConfig, *, num_epochs: int | None, host_batch_size: int,
                 shard_index: int = 0, num_shards: int = 1, plan_epochs: bool = False,
                 agree_on_steps: Callable[[int, int], int] = max_over_processes):
        self.config = config
        self.num_epochs = num_epochs
        self.host_batch_size = host_batch_size
        self.shard_index = shard_index
        self.num_shards = num_shards
        self.plan_epochs = plan_epochs
        self._agree_on_steps = agree_on_steps
        self.epoch = 0
        self.batches_in_epoch = 0
        self.end_of_epoch = False
        self.last_epoch_stats: dict[str, int] = {}
        self._agreed_steps: dict[int, int] = {}  # epoch -> agreed length, once known (planned mode)
        self._counting: dict[int, concurrent.futures.Future] = {}
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._closed = threading.Event()  # stops a count in progress
        self._it: Iterator[dict[str, np.ndarray]] | None = None
        self._stats: PipelineStats | None = None
        self._pending: dict[str, np.ndarray] | None = None
        self._element_spec: dict[str, Any] = {}

    # ------------------------------------------------------------------------------ planning

    def _count(self, epoch: int) -> tuple[int, dict[str, int]]:
        return count_batches(self.config, epoch=epoch, host_batch_size=self.host_batch_size,
                             shard_index=self.shard_index, num_shards=self.num_shards, cancel=self._closed)

    def _count_ahead(self, epoch: int) -> None:
        if self.num_epochs is not None and epoch >= self.num_epochs:
            return
        if epoch not in self._counting and epoch not in self._agreed_steps:
            if self._executor is None:
                self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="count-epoch")
            self._counting[epoch] = self._executor.submit(self._count, epoch)

    def steps_in_epoch(self, epoch: int) -> int:
        """The agreed number of steps of `epoch` (counted and agreed once; a collective when multi-process)."""
        if epoch in self._agreed_steps:
            return self._agreed_steps[epoch]
        future = self._counting.pop(epoch, None)
        local_steps, _ = future.result() if future is not None else self._count(epoch)
        steps = self._agree_on_steps(epoch, local_steps)
        if steps == 0:
            raise EmptySplitError(
                f"Split {self.config.split!r} of {self.config.mixture_or_task_name!r} yields no examples "
                f"(epoch {epoch}, {self.num_shards} data shard(s)); add data or check the task's split.")
        self._agreed_steps[epoch] = steps
        return steps

    # ------------------------------------------------------------------------------ reading

    def _open(self) -> None:
        self._stats = PipelineStats(list(self.config.seqio_lengths()))
        dataset = epoch_dataset(self.config, epoch=self.epoch, host_batch_size=self.host_batch_size,
                                shard_index=self.shard_index, num_shards=self.num_shards, stats=self._stats)
        self._element_spec = dataset.element_spec
        self._it = dataset.skip(self.batches_in_epoch).as_numpy_iterator()

    def prepare(self) -> None:
        """Builds the current epoch's pipeline now (its errors surface here), to be read next."""
        if self._it is None and (self.num_epochs is None or self.epoch < self.num_epochs):
            self._open()

    def _fetch(self) -> dict[str, np.ndarray] | None:
        if self._it is None:
            self._open()
        with _reading(self.config):
            return next(self._it, None)

    def _empty_batch(self) -> dict[str, np.ndarray]:
        """A batch of all-zero rows shaped like the pipeline's (for a shard that ran out)."""
        return {k: np.zeros((self.host_batch_size, *spec.shape[1:]), spec.dtype.as_numpy_dtype)
                for k, spec in self._element_spec.items()}

    def __iter__(self) -> "BatchIterator":
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        if self.num_epochs is not None and self.epoch >= self.num_epochs:
            raise StopIteration
        return self._next_planned() if self.plan_epochs else self._next_lookahead()

    def _finish_epoch(self) -> None:
        self.last_epoch_stats = self._stats.as_dict() if self._stats is not None else {}
        self.epoch, self.batches_in_epoch = self.epoch + 1, 0
        self._agreed_steps.pop(self.epoch - 1, None)
        self._it, self._stats = None, None
        self.end_of_epoch = True

    def _next_lookahead(self) -> dict[str, np.ndarray]:
        batch = self._pending if self._pending is not None else self._fetch()
        if batch is None:
            raise EmptySplitError(
                f"Split {self.config.split!r} of {self.config.mixture_or_task_name!r} yields no "
                f"examples for shard {self.shard_index} of {self.num_shards}; add data or use fewer shards.")
        self.batches_in_epoch += 1
        # Look one batch ahead so the caller learns at once that this batch ended the epoch.
        self._pending = self._fetch()
        self.end_of_epoch = False
        if self._pending is None:
            self._finish_epoch()
        return _pad_rows(dict(batch), self.host_batch_size)

    def _next_planned(self) -> dict[str, np.ndarray]:
        steps = self.steps_in_epoch(self.epoch)
        self._count_ahead(self.epoch + 1)
        batch = self._fetch()
        batch = _pad_rows(dict(batch), self.host_batch_size) if batch is not None else self._empty_batch()
        self.batches_in_epoch += 1
        self.end_of_epoch = False
        if self.batches_in_epoch == steps:
            if self._fetch() is not None:
                raise RuntimeError(
                    f"Shard {self.shard_index} of {self.num_shards} has more than the {steps} "
                    f"batches counted for epoch {self.epoch}: the input pipeline is not deterministic "
                    "(a preprocessor without seqio's seeded random ops?).")
            self._finish_epoch()
        return batch

    # ------------------------------------------------------------------------------ state

    def get_state(self) -> dict[str, Any]:
        """A small JSON-able state: restoring it resumes the exact same stream.

        Every data shard takes one batch per step, so all shards are at the same position and
        one process's state (process 0's, the one a checkpoint keeps) restores every shard.
        """
        return {"epoch": self.epoch, "batches_in_epoch": self.batches_in_epoch,
                "steps_in_epoch": self._agreed_steps.get(self.epoch),
                "shard_index": self.shard_index, "num_shards": self.num_shards}

    def set_state(self, state: dict[str, Any]) -> None:
        if state.get("reader", "stream") != "stream":
            raise ValueError(
                f"The checkpoint's data position was saved by the {state['reader']} reader, but this run streams "
                "the data: the two orders differ, so the position cannot be continued exactly. Resume with "
                f"--gin.train/DataConfig.reader=\"'{state['reader']}'\".")
        if state["num_shards"] != self.num_shards:
            raise ValueError(
                f"The saved data position is for {state['num_shards']} data shard(s), but this run reads "
                f"{self.num_shards}: the positions of a different number of shards (processes) cannot be "
                "continued exactly. Resume with the process count and mesh the run was saved with.")
        self.epoch, self.batches_in_epoch = int(state["epoch"]), int(state["batches_in_epoch"])
        saved_steps = state.get("steps_in_epoch")
        self._agreed_steps = {self.epoch: int(saved_steps)} if self.plan_epochs and saved_steps else {}
        self.end_of_epoch, self._it, self._stats, self._pending = False, None, None, None

    def close(self) -> None:
        """Stops counting ahead: a count in progress ends within one block of rows."""
        self._closed.set()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
