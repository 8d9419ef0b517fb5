"""The front door to a run's batches: the iterator of a DataConfig's split, read by index when the
task allows (indexed/index_plan.py decides, indexed/indexed_input.py reads; no seqio or
TensorFlow) and else streamed through seqio (streaming/input_pipeline.py); and a split's pipeline
errors as a user sees them.

Training builds its iterators here only: `build` (train, or a validation pass) and `check_split`
(an eval split's pipeline, built before anything is written).
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Iterator

from t5x_lite.data import task_registry
from t5x_lite.data.indexed import index_plan
from t5x_lite.data.indexed.indexed_input import IndexedBatchIterator
from t5x_lite.data.streaming import input_pipeline
from t5x_lite.data.streaming.input_pipeline import BatchIterator
from t5x_lite.data.task_access import DataConfig
from t5x_lite.errors import RunConfigError, TaskDataError, UserError

DataIterator = BatchIterator | IndexedBatchIterator  # both checkpointable with a few integers


@dataclasses.dataclass(frozen=True)
class Batches:
    """An iterator of host-local batches, and what the start-up line says of it."""

    iterator: DataIterator
    steps_per_epoch: int | None  # None when epochs are not planned
    streamed_because: str  # why the data is read by streaming; '' when it is read by index

    @property
    def by_index(self) -> bool:
        return isinstance(self.iterator, IndexedBatchIterator)


def build(config: DataConfig, *, num_epochs: int | None, host_batch_size: int, shard_index: int = 0,
          num_shards: int = 1, plan_epochs: bool = False, validation: bool = False) -> Batches:
    """The iterator of `config`'s split for this data shard.

    Train (validation=False): by index when the task allows, else streaming; its first batch or
    pipeline is built now, so a bad length or split stops the run here (RunConfigError). Several
    data shards must stop together, so streamed epochs are then always planned (counted up front).
    validation=True: one pass in order, laid out as training reads the split: by index when the task
    allows (its rows in index order), else streamed, built when first read (planned with several shards).
    """
    with pipeline_errors(config):
        _check_prepared_split(config)
        plan, streamed_because = index_plan.plan(dataclasses.replace(config, shuffle=False) if validation else config)
    if plan is not None:
        indexed = IndexedBatchIterator(plan, num_epochs=num_epochs, host_batch_size=host_batch_size,
                                       shard_index=shard_index, num_shards=num_shards)
        if not validation:
            with pipeline_errors(config):
                indexed.prepare()
        return Batches(iterator=indexed, steps_per_epoch=indexed.steps_per_epoch, streamed_because="")
    if validation:
        iterator = BatchIterator(config, num_epochs=num_epochs, host_batch_size=host_batch_size,
                                 shard_index=shard_index, num_shards=num_shards, plan_epochs=num_shards > 1)
        return Batches(iterator=iterator, steps_per_epoch=None, streamed_because=streamed_because)
    plan_epochs = plan_epochs or num_shards > 1
    streamed = BatchIterator(config, num_epochs=num_epochs, host_batch_size=host_batch_size,
                             shard_index=shard_index, num_shards=num_shards, plan_epochs=plan_epochs)
    with pipeline_errors(config):
        steps_per_epoch = streamed.steps_in_epoch(0) if plan_epochs else None
        streamed.prepare()
    return Batches(iterator=streamed, steps_per_epoch=steps_per_epoch, streamed_because=streamed_because)


def check_split(config: DataConfig, *, shard_index: int, num_shards: int) -> None:
    """Builds (without reading) the first epoch's pipeline of `config`'s split: a bad length or
    split stops a run before anything is written (RunConfigError)."""
    with pipeline_errors(config):
        _check_prepared_split(config)
        plan, _ = index_plan.plan(dataclasses.replace(config, shuffle=False))
        if plan is None:
            input_pipeline.epoch_rows(config, epoch=0, shard_index=shard_index, num_shards=num_shards)


def _check_prepared_split(config: DataConfig) -> None:
    """A prepared task (or mixture) without the split fails here, naming the splits it has."""
    entry = task_registry.lookup(config.mixture_or_task_name)
    for task in task_registry.task_entries(entry) if entry is not None else []:
        task_registry.split_entry(task, config.split, what=config.mixture_or_task_name)


@contextlib.contextmanager
def pipeline_errors(cfg: DataConfig) -> Iterator[None]:
    """Turns a preprocessor's complaint about the lengths or the data, raised while a split's
    pipeline is built, into a RunConfigError (the run stops before anything is written)."""
    try:
        yield
    except (input_pipeline.MissingSplitError, TaskDataError) as e:
        raise RunConfigError(str(e)) from None
    except UserError:  # already names the problem (a damaged file, a bad value)
        raise
    except ValueError as e:
        raise RunConfigError(
            f"The {cfg.split} input pipeline of {cfg.mixture_or_task_name!r} cannot be built: {e}\n"
            "Check SEQUENCE_LENGTH (and INPUTS_LENGTH) against what the task's preprocessors produce."
        ) from None
