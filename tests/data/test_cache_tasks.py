"""`t5x-lite cache`: seqio's offline cache of a task, built with Beam's DirectRunner, read back with use_cached."""

import collections
import json
import pickle

import pytest

from t5x_lite.config import cache_command, parsing
from t5x_lite.data import task_access, task_factories, task_registry
from t5x_lite.data.indexed import index_plan

TASK = "test_cache_small_lm"
LENGTHS = {"targets": 64}


def _task_gin(path, data_dir, name=TASK):
    path.write_text(f"MIXTURE_OR_TASK_NAME = @lm_task()\nlm_task.name = '{name}'\n"
                    f"lm_task.data_dir = '{data_dir}'\n")
    return path


@pytest.fixture(scope="module")
def cache_dir(small_data_dir, tmp_path_factory):
    """The small LM task cached with the DirectRunner, 3 shards per split."""

    root = tmp_path_factory.mktemp("cache")
    gin_file = _task_gin(root / "task.gin", small_data_dir)
    assert cache_command.main([f"--gin_file={gin_file}", f"--output_cache_dir={root / 'cache'}",
                             "--min_shards=3"]) == 0
    return root / "cache"


def _examples(task, split, use_cached):
    dataset = task.get_dataset(LENGTHS, split=split, use_cached=use_cached, shuffle=False)
    return collections.Counter(tuple(ex["targets"].tolist()) for ex in dataset.as_numpy_iterator())


def test_cache_holds_every_split_with_info_and_stats(cache_dir, small_data_dir):
    metadata = json.loads((small_data_dir / "metadata.json").read_text())
    task_dir = cache_dir / TASK
    assert (task_dir / "COMPLETED").exists()
    for split, counts in metadata["splits"].items():
        info = json.loads((task_dir / f"info.{split}.json").read_text())
        assert info["num_shards"] == 3
        assert info["features"] == {"targets": {"dtype": "int32", "shape": [None]}}
        assert len(list(task_dir.glob(f"{split}.tfrecord-*-of-00003"))) == 3
        # Cached before splitting: one example per document, every token (no EOS or padding yet).
        stats = json.loads((task_dir / f"stats.{split}.json").read_text())
        assert stats["examples"] == counts["num_examples"]
        assert stats["targets_tokens"] == counts["num_tokens"]


def test_use_cached_reads_the_same_examples(cache_dir, small_data_dir):
    name = task_factories.lm_task(name=TASK, data_dir=str(small_data_dir), cache_dir=str(cache_dir))
    task = task_access.get_task(name)
    assert task.cache_dir == str(cache_dir / TASK)
    for split in ("train", "validation"):
        cached = _examples(task, split, use_cached=True)
        assert cached and cached == _examples(task, split, use_cached=False)


def test_a_cached_lm_task_is_read_by_index(cache_dir, small_data_dir):
    """The cache's offset index: an epoch read by index holds every cached document + EOS once."""
    import tensorflow as tf

    from t5x_lite.data.indexed import indexed_input
    from t5x_lite.data.records import record_index
    from tests.data.test_input_pipeline import real_tokens

    name = task_factories.lm_task(name=TASK, data_dir=str(small_data_dir), cache_dir=str(cache_dir))
    config = task_access.DataConfig(name, split="validation", sequence_length=64, batch_size=4, use_cached=True)
    plan, why = index_plan.plan(config)
    assert plan is not None, why
    assert plan.tasks[0].records.data_dir == str(cache_dir / TASK)
    assert json.loads((cache_dir / TASK / record_index.cached_entry_name("validation")).read_text())["num_shards"] == 3
    epoch = list(indexed_input.IndexedBatchIterator(plan, num_epochs=1, host_batch_size=4))
    expected = collections.Counter()  # the cache's shards read by tf.data
    files = sorted(str(p) for p in (cache_dir / TASK).glob("validation.tfrecord-*"))
    for record in tf.data.TFRecordDataset(files).as_numpy_iterator():
        example = tf.io.parse_single_example(record, {"targets": tf.io.RaggedFeature(tf.int64)})
        expected.update([*example["targets"].numpy().tolist(), plan.eos_id])
    assert sum(expected.values()) > 100
    assert real_tokens(epoch) == expected


def test_the_estimate_and_the_reader_agree_on_a_cached_task(cache_dir, small_data_dir, capsys):
    """With use_cached both read the cache's index, not the prepared directory's."""
    from tests.data.test_epochs import estimated_epoch, read_epoch

    data = estimated_epoch(capsys, f"--gin.DATA_DIR='{small_data_dir}'", f"--gin.lm_task.name='{TASK}'",
                           f"--gin.lm_task.cache_dir='{cache_dir}'", "--gin.USE_CACHED_TASKS=True",
                           "--gin.SEQUENCE_LENGTH=32", "--gin.BATCH_SIZE=4")
    name = task_factories.lm_task(name=TASK, data_dir=str(small_data_dir), cache_dir=str(cache_dir))
    reader = read_epoch(name, length=32, batch=4, use_cached=True)
    assert reader.plan.tasks[0].records.data_dir == str(cache_dir / TASK)
    assert data["exact"] and data["read"] == "by index" and str(cache_dir / TASK) in data["note"]
    assert data["steps_per_epoch"] == reader.steps_per_epoch > 1
    assert data["tokens_per_epoch"] == reader.plan.tasks[0].records.stream_tokens
    # Without the cache's index (a cache built before caches had one) both stream: the estimate's lower bound.
    (cache_dir / TASK / "train.index.json").rename(cache_dir / TASK / "train.index.json.aside")
    try:
        data = estimated_epoch(capsys, f"--gin.DATA_DIR='{small_data_dir}'", f"--gin.lm_task.name='{TASK}'",
                               f"--gin.lm_task.cache_dir='{cache_dir}'", "--gin.USE_CACHED_TASKS=True")
        assert "exact" not in data and "has no index for split 'train'" in data["read"]
        config = task_access.DataConfig(name, sequence_length=32, use_cached=True)
        assert "has no index for split 'train'" in index_plan.plan(config)[1]
    finally:
        (cache_dir / TASK / "train.index.json.aside").rename(cache_dir / TASK / "train.index.json")


def test_use_cached_without_a_cache_names_the_cache_command(small_data_dir):
    from t5x_lite.data.tasks import lm

    name = task_factories.lm_task(name="test_cache_never_cached", data_dir=str(small_data_dir))
    task = task_access.get_task(name)
    with pytest.raises(lm.TaskDataError, match=r"t5x-lite cache --tasks=test_cache_never_cached"):
        task.get_dataset(LENGTHS, split="validation", use_cached=True, shuffle=False)


def test_a_second_run_skips_the_cached_task(cache_dir, small_data_dir, tmp_path, capsys):
    gin_file = _task_gin(tmp_path / "task.gin", small_data_dir)
    assert cache_command.main([f"--gin_file={gin_file}", f"--output_cache_dir={cache_dir}"]) == 0
    assert "already cached" in capsys.readouterr().out


@pytest.mark.parametrize("flags, message", [
    (["--direct_num_worker=2"], r"Unknown flags \['--direct_num_worker'\]"),
    (["--output_cache_dir=s3://bucket/cache"], "no s3 filesystem"),
    (["--tasks=no_such_task"], "No seqio task or mixture named 'no_such_task'"),
])
def test_bad_flags_are_reported(flags, message, small_data_dir, tmp_path, capsys):
    import re

    gin_file = _task_gin(tmp_path / "task.gin", small_data_dir)
    flags = [f"--gin_file={gin_file}", f"--output_cache_dir={tmp_path / 'cache'}", *flags]
    assert cache_command.main(flags) == 2
    assert re.search(message, capsys.readouterr().err)
    assert not (tmp_path / "cache").exists()


def test_workers_repeat_the_registration(small_data_dir, tmp_path):
    """Beam workers in other processes get the recipe pickled and register the task themselves."""
    import gin
    import seqio

    name = "test_cache_worker_lm"
    parsing.parse(gin_files=[str(_task_gin(tmp_path / "task.gin", small_data_dir, name))])
    recipe = cache_command.Registration(task_names=(name,), gin_config=gin.config_str())
    assert recipe.register() == [name]
    seqio.TaskRegistry.remove(name)
    task_registry._REGISTRY.pop(name)  # as in a fresh worker process
    pickle.loads(pickle.dumps(recipe))()
    assert name in seqio.TaskRegistry.names()
