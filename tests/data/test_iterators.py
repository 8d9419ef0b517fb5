"""The front door (data/iterators.py): by index when the task allows, else streamed; a validation
pass; a split's pipeline errors as RunConfigError."""

from __future__ import annotations

import numpy as np
import pytest

from t5x_lite.data import iterators, task_access, task_factories
from t5x_lite.data.indexed.indexed_input import IndexedBatchIterator
from t5x_lite.data.streaming.input_pipeline import BatchIterator
from t5x_lite.errors import RunConfigError
from tests.data import test_indexed_input
from tests.data.test_input_pipeline import split_epochs

SEQ = test_indexed_input.SEQ
id_dir = test_indexed_input.id_dir  # its prepared directory of token ids (a fixture)


@pytest.fixture(scope="module")
def ids(id_dir) -> str:
    return task_factories.lm_task(name="test_front_door_ids", data_dir=str(id_dir))


def config(task: str, **kwargs) -> task_access.DataConfig:
    return task_access.DataConfig(task, sequence_length=SEQ, batch_size=4, seed=7, **kwargs)


def test_an_indexable_task_is_read_by_index_and_reader_stream_streams_it(ids):
    by_index = iterators.build(config(ids), num_epochs=1, host_batch_size=4)
    assert by_index.by_index and isinstance(by_index.iterator, IndexedBatchIterator)
    assert by_index.streamed_because == ""
    assert by_index.steps_per_epoch == by_index.iterator.steps_per_epoch > 0
    assert [len(e) for e in split_epochs(by_index.iterator)] == [by_index.steps_per_epoch]
    by_index.iterator.close()

    streamed = iterators.build(config(ids, reader="stream"), num_epochs=1, host_batch_size=4, plan_epochs=True)
    assert not streamed.by_index and isinstance(streamed.iterator, BatchIterator)
    assert "reader='stream'" in streamed.streamed_because
    assert [len(e) for e in split_epochs(streamed.iterator)] == [streamed.steps_per_epoch]
    streamed.iterator.close()

    unplanned = iterators.build(config(ids, reader="stream"), num_epochs=1, host_batch_size=4)
    assert unplanned.steps_per_epoch is None  # one data shard: epochs are planned only when asked
    unplanned.iterator.close()


def test_a_validation_pass_is_read_by_index_in_order_laid_out_as_training_reads_the_split(ids):
    batches = iterators.build(config(ids), num_epochs=1, host_batch_size=4, validation=True)
    assert batches.by_index and not batches.iterator.plan.shuffle
    validation = list(batches.iterator)
    batches.iterator.close()
    in_order = iterators.build(config(ids, shuffle=False), num_epochs=1, host_batch_size=4)
    training = list(in_order.iterator)
    in_order.iterator.close()
    assert len(validation) == len(training) == in_order.steps_per_epoch > 1
    for seen, trained in zip(validation, training):
        assert seen.keys() == trained.keys() and all(np.array_equal(seen[k], trained[k]) for k in seen)

    streamed = iterators.build(config(ids, reader="stream"), num_epochs=1, host_batch_size=4, validation=True)
    assert not streamed.by_index and "reader='stream'" in streamed.streamed_because
    assert len(split_epochs(streamed.iterator)) == 1
    streamed.iterator.close()


def test_a_missing_split_stops_the_run_with_the_splits_named(ids):
    with pytest.raises(RunConfigError, match="has no split 'test'"):
        iterators.check_split(config(ids, split="test"), shard_index=0, num_shards=1)
    with pytest.raises(RunConfigError, match="has no split 'test'"):
        iterators.build(config(ids, split="test", reader="stream"), num_epochs=1, host_batch_size=4)
