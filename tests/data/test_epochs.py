"""The epoch rules (data/indexed/epochs.py): pure, then shared by the index reader and `t5x-lite estimate`,
which must agree on every task the reader reads by index."""

from __future__ import annotations

import json

import pytest

from t5x_lite.data import task_access, task_factories
from t5x_lite.data.indexed import epochs, index_plan, indexed_input, mixing
from t5x_lite.data.preparation import index_command
from t5x_lite.estimate import command as estimate
from tests.data.test_indexed_input import write_id_directory

# ------------------------------------------------------------------------------ pure


def test_lengths_of_one_task_and_of_a_mixture():
    assert epochs.positions_per_epoch([10], [1.0]) == 10
    # A mixture: as many positions as the scarcest task (rows per unit of rate) fills in its epoch.
    counts = mixing.apportion([1.0, 3.0])  # 2048 and 6144 of a block of 8192
    assert epochs.positions_per_epoch([100, 150], [1.0, 3.0]) == min(100 * 8192 // counts[0], 150 * 8192 // counts[1])
    assert epochs.positions_per_epoch([100, 150], [1.0, 3.0]) == 200  # the second: 150 rows are 3/4 of 200
    assert epochs.positions_per_epoch([10, 150], [1.0, 3.0]) == 40  # the first: 10 rows are 1/4 of 40
    assert [epochs.steps_per_epoch(p, 8) for p in (0, 1, 8, 9, 16)] == [1, 1, 1, 2, 2]
    epoch = epochs.indexed_epoch([1000, 33], [1.0, 1.0], length=32, global_batch=4)
    assert epoch == epochs.Epoch(rows=(32, 2), positions=4, steps=1)
    assert epochs.indexed_epoch([1000], [1.0], length=32, global_batch=4) == epochs.Epoch(rows=(32,), positions=32,
                                                                                       steps=8)


LM = epochs.Task("a", lm=True, data_dir="/data/a")
INDEXED = {"index": {"stream_tokens": 100}, "num_examples": 5}


def _sources(root, *, entries=None, caches=None, **settings):
    settings = {"split": "train", "reader": "auto", "converter": "lm", "pack": True, "use_cached": False, **settings}
    entries = {"/data/a": INDEXED, "/data/b": INDEXED} if entries is None else entries
    return epochs.index_sources(lambda: root, cache_dir_of=lambda task: (caches or {}).get(task.name),
                                entry_of=lambda directory, cached: entries.get(directory), **settings)


def _why(root, **kwargs) -> str:
    with pytest.raises(epochs.NotIndexable) as e:
        _sources(root, **kwargs)
    return str(e.value)


def test_what_is_read_by_index_and_why_the_rest_is_streamed():
    (source,) = _sources(LM)
    assert (source.task, source.directory, source.rate, source.stream_tokens) == ("a", "/data/a", 1.0, 100)
    mixture = epochs.Mixture("m", ((LM, 1.0), (epochs.Mixture("inner", ((epochs.Task("b", True, "/data/b"), 2.0),)),
                                               3.0)))
    assert [(s.task, s.rate) for s in _sources(mixture)] == [("a", 0.25), ("b", 0.75)]
    assert _why(LM, reader="stream") == "DataConfig.reader='stream'"
    assert "'enc_dec'" in _why(LM, converter="enc_dec")
    assert "pack=False" in _why(LM, pack=False)
    assert "exhaust_all_tasks" in _why(epochs.Mixture("m", ((LM, 1.0),), exhaust_all_tasks=True))
    assert "not an lm_task" in _why(epochs.Mixture("m", ((LM, 1.0), (epochs.Task("sc", False, "/d"), 1.0))))
    assert "tokenizes raw text" in _why(epochs.Task("text", lm=True, data_dir=None))
    assert "has no split 'train'" in _why(LM, entries={})
    assert "t5x-lite index /data/a" in _why(LM, entries={"/data/a": {"num_examples": 5}})
    # use_cached: the offline cache's entry, never the prepared directory's.
    assert "has no offline cache" in _why(LM, use_cached=True)
    assert "no index for split" in _why(LM, use_cached=True, caches={"a": "/cache/a"})
    (cached,) = _sources(LM, use_cached=True, caches={"a": "/cache/a"}, entries={"/cache/a": INDEXED})
    assert cached.directory == "/cache/a"


def test_the_tree_is_not_built_when_the_settings_already_stream():
    def root():
        raise AssertionError("built")

    for settings in ({"reader": "stream"}, {"converter": "prefix_lm"}, {"pack": False}):
        with pytest.raises(epochs.NotIndexable):
            epochs.index_sources(root, **{"split": "train", "reader": "auto", "converter": "lm", "pack": True,
                                          "use_cached": False, **settings},
                                 cache_dir_of=lambda task: None, entry_of=lambda directory, cached: None)


# ------------------------------------------------------------------------------ the estimate agrees with the reader


def estimated_epoch(capsys, *flags: str) -> dict:
    """The data section of `t5x-lite estimate --json` for runs/quickstart.gin with these flags."""
    assert estimate.main(["--gin_file=runs/quickstart.gin", "--num_devices=1", *flags, "--json"]) == 0
    return json.loads(capsys.readouterr().out)["data"]


def read_epoch(task: str, *, length: int, batch: int, **kwargs) -> indexed_input.IndexedBatchIterator:
    plan, why = index_plan.plan(task_access.DataConfig(task, sequence_length=length, batch_size=batch, **kwargs))
    assert plan is not None, why
    return indexed_input.IndexedBatchIterator(plan, num_epochs=1, host_batch_size=batch)


def test_the_estimate_and_the_reader_agree_on_an_lm_task(small_data_dir, capsys):
    data = estimated_epoch(capsys, f"--gin.DATA_DIR='{small_data_dir}'", "--gin.SEQUENCE_LENGTH=32",
                           "--gin.BATCH_SIZE=4")
    reader = read_epoch(task_factories.lm_task(name="test_epochs_lm", data_dir=str(small_data_dir)), length=32, batch=4)
    assert data["exact"] and data["read"] == "by index"
    assert data["steps_per_epoch"] == reader.steps_per_epoch > 1
    assert data["tokens_per_epoch"] == reader.plan.tasks[0].records.stream_tokens


def test_the_estimate_and_the_reader_agree_on_a_mixture(small_data_dir, tmp_path, capsys):
    dirs = {}
    for name, num_docs in (("a", 120), ("b", 60)):
        dirs[name] = tmp_path / name
        write_id_directory(dirs[name], small_data_dir / "spm.model", num_docs=num_docs)
        index_command.index_directory(str(dirs[name]), log=lambda _: None)
    (tmp_path / "mixture.gin").write_text(
        "MIXTURE_OR_TASK_NAME = @mixture()\n"
        "mixture.name = 'test_epochs_mix'\n"
        "mixture.tasks = [(@a/lm_task(), 1.0), (@b/lm_task(), 3.0)]\n"
        f"a/lm_task.name = 'test_epochs_mix_a'\na/lm_task.data_dir = '{dirs['a']}'\n"
        f"b/lm_task.name = 'test_epochs_mix_b'\nb/lm_task.data_dir = '{dirs['b']}'\n")
    data = estimated_epoch(capsys, f"--gin_file={tmp_path / 'mixture.gin'}", "--gin.SEQUENCE_LENGTH=32",
                           "--gin.BATCH_SIZE=4")
    a = task_factories.lm_task(name="test_epochs_mix_a", data_dir=str(dirs["a"]))
    b = task_factories.lm_task(name="test_epochs_mix_b", data_dir=str(dirs["b"]))
    reader = read_epoch(task_factories.mixture(name="test_epochs_mix", tasks=[(a, 1.0), (b, 3.0)]), length=32,
                        batch=4)
    assert data["exact"] and data["read"] == "by index"
    assert data["steps_per_epoch"] == reader.steps_per_epoch > 1
    assert data["tokens_per_epoch"] == reader.positions_per_epoch * 32
    # With exhaust_all_tasks both say the mixture is streamed.
    (tmp_path / "exhaust.gin").write_text("mixture.exhaust_all_tasks = True\n")
    data = estimated_epoch(capsys, f"--gin_file={tmp_path / 'mixture.gin'}", f"--gin_file={tmp_path / 'exhaust.gin'}")
    assert data["steps_per_epoch"] is None and "exhaust_all_tasks=True" in data["note"]
    streamed = task_factories.mixture(name="test_epochs_mix", tasks=[(a, 1.0), (b, 3.0)], exhaust_all_tasks=True)
    assert "exhaust_all_tasks=True" in index_plan.plan(task_access.DataConfig(streamed, sequence_length=32))[1]
