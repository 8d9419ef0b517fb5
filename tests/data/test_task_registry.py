"""Prepared tasks known without seqio (data/task_registry.py): registration, vocabulary, documents,
mixtures, the seqio task made on first use, and the one line naming the extra when seqio is missing."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from t5x_lite.data import iterators, task_access, task_factories, task_registry
from t5x_lite.errors import MissingExtraError, RunConfigError, TaskDataError

SEQ = 32


@pytest.fixture
def without_seqio(monkeypatch):
    """`import seqio` fails (and seqio counts as not loaded), as where it is not installed."""
    monkeypatch.setitem(sys.modules, "seqio", None)


def test_a_prepared_task_is_read_without_seqio(small_data_dir, without_seqio):
    name = task_factories.lm_task(name="test_registry_plain", data_dir=str(small_data_dir))
    vocabulary = task_access.task_vocabulary(name)
    assert type(vocabulary).__module__ == "t5x_lite.data.vocab.sentencepiece_vocabulary"
    assert vocabulary.decode(vocabulary.encode("import json")) == "import json"
    documents = task_access.split_documents(name, "train", max_tokens=SEQ, limit=5)
    assert len(documents) == 5 and all(0 < len(d) <= SEQ and d[-1] == vocabulary.eos_id for d in documents)
    config = task_access.DataConfig(name, split="validation", sequence_length=SEQ, batch_size=4)
    iterators.check_split(config, shard_index=0, num_shards=1)
    batches = iterators.build(config, num_epochs=1, host_batch_size=4, validation=True)
    assert batches.by_index and next(iter(batches.iterator))["decoder_target_tokens"].shape == (4, SEQ)
    batches.iterator.close()


def test_what_needs_seqio_says_which_extra_to_install(small_data_dir, without_seqio):
    with pytest.raises(MissingExtraError, match=r"span_corruption_task needs seqio.*t5x-lite\[seqio\]"):
        task_factories.span_corruption_task(name="test_registry_span", data_dir=str(small_data_dir))
    name = task_factories.lm_task(name="test_registry_streamed", data_dir=str(small_data_dir))
    with pytest.raises(MissingExtraError, match=r"through seqio needs seqio.*t5x-lite\[seqio\]"):
        iterators.build(task_access.DataConfig(name, sequence_length=SEQ, batch_size=4, reader="stream"),
                        num_epochs=1, host_batch_size=4)


def test_a_missing_split_names_the_splits_without_seqio(small_data_dir, without_seqio):
    name = task_factories.lm_task(name="test_registry_split", data_dir=str(small_data_dir))
    with pytest.raises(RunConfigError, match=r"has no split 'test'; its splits are \['train', 'validation'\]"):
        iterators.check_split(task_access.DataConfig(name, split="test", sequence_length=SEQ), shard_index=0,
                              num_shards=1)


def test_the_seqio_task_made_on_first_use_gives_the_same_documents(small_data_dir):
    name = task_factories.lm_task(name="test_registry_seqio", data_dir=str(small_data_dir))
    ours = task_access.split_documents(name, "validation", max_tokens=SEQ)
    task = task_access.get_task(name)
    assert task is task_access.get_task(name) and task_registry.lookup(name) is not None
    dataset = task.get_dataset(sequence_length={"targets": SEQ}, split="validation", shuffle=False, num_epochs=1)
    theirs = [example["targets"].tolist() for example in dataset.as_numpy_iterator()]
    assert sorted(map(tuple, ours)) == sorted(map(tuple, theirs)) and len(ours) > 10
    assert ours[:3] == theirs[:3]  # the first shard's first documents come first either way


def test_a_name_seqio_holds_for_other_code_is_no_longer_a_prepared_task(small_data_dir):
    import seqio

    name = task_factories.lm_task(name="test_registry_replaced", data_dir=str(small_data_dir))
    task_access.get_task(name)
    seqio.TaskRegistry.remove(name)
    seqio.TaskRegistry.add(name, source=seqio.FunctionDataSource(lambda split, shuffle_files: None, splits=["train"]),
                           output_features={})
    try:
        assert task_registry.lookup(name) is None
    finally:
        seqio.TaskRegistry.remove(name)


def test_a_mixture_of_prepared_tasks_is_read_by_index_and_checked(small_data_dir, without_seqio):
    a = task_factories.lm_task(name="test_registry_mix_a", data_dir=str(small_data_dir))
    b = task_factories.lm_task(name="test_registry_mix_b", data_dir=str(small_data_dir))
    mixture = task_factories.mixture(name="test_registry_mix", tasks=[(a, 1.0), (b, 3.0)])
    batches = iterators.build(task_access.DataConfig(mixture, sequence_length=SEQ, batch_size=8), num_epochs=1,
                              host_batch_size=8)
    assert batches.by_index and [t.rate for t in batches.iterator.plan.tasks] == [0.25, 0.75]
    assert np.asarray(next(iter(batches.iterator))["decoder_loss_weights"]).sum() > 0
    batches.iterator.close()
    with pytest.raises(TaskDataError, match="rates are positive"):
        task_factories.mixture(name="test_registry_bad", tasks=[(a, 0.0)])
    with pytest.raises(TaskDataError, match="already a task's name"):
        task_factories.mixture(name=a, tasks=[(b, 1.0)])


def test_registering_a_name_again_over_another_directory_replaces_its_seqio_task(small_data_dir, data_dir):
    name = task_factories.lm_task(name="test_registry_moved", data_dir=str(small_data_dir))
    first = task_access.get_task(name)
    task_factories.lm_task(name=name, data_dir=str(data_dir))
    assert task_registry.lookup(name).data_dir == str(data_dir)
    second = task_access.get_task(name)
    assert second is not first
    ours = task_access.split_documents(name, "validation", max_tokens=SEQ, limit=3)
    theirs = [ex["targets"].tolist() for ex in second.get_dataset(
        sequence_length={"targets": SEQ}, split="validation", shuffle=False, num_epochs=1).take(3).as_numpy_iterator()]
    assert ours == theirs
