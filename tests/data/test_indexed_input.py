"""Reading by index: the permutation, packed rows, the offset index, epochs and O(1) resume, mixtures."""

from __future__ import annotations

import json
import shutil
from collections import Counter

import numpy as np
import pytest

from t5x_lite.data import task_access, task_factories
from t5x_lite.data.indexed import index_permutation, index_plan, indexed_input, mixing, token_rows
from t5x_lite.data.preparation import index_command
from t5x_lite.data.records import record_index, tfrecord_stream
from t5x_lite.data.streaming import input_pipeline
from t5x_lite.errors import ConfigValueError
from tests.data.test_input_pipeline import assert_same_batches, real_tokens, split_epochs

NUM_DOCS, SEQ = 120, 32


# ------------------------------------------------------------------------------ pure functions


@pytest.mark.parametrize("size", [1, 2, 3, 5, 17, 64, 1000, 4097])
@pytest.mark.parametrize("seed", [0, 1, 12345])
def test_permutation_is_a_bijection(size, seed):
    order = index_permutation.permute(np.arange(size), size=size, seed=seed)
    assert sorted(order.tolist()) == list(range(size))


def test_permutation_depends_on_the_seed_and_is_evaluated_anywhere():
    a = index_permutation.permute(np.arange(1000), size=1000, seed=1)
    b = index_permutation.permute(np.arange(1000), size=1000, seed=2)
    assert not np.array_equal(a, b) and not np.array_equal(a, np.arange(1000))
    # Position by position equals all at once, also at positions far into a huge epoch.
    assert [int(index_permutation.permute(i, size=1000, seed=1)) for i in (0, 500, 999)] == [a[0], a[500], a[999]]
    huge = 10**12
    far = index_permutation.permute(np.array([0, 10**6, huge - 1]), size=huge, seed=3)
    assert (far >= 0).all() and (far < huge).all() and len(set(far.tolist())) == 3


def test_lm_rows_equal_seqio_packing():
    """A row of whole examples is what seqio's LMFeatureConverter packs from the same examples."""
    import seqio
    import tensorflow as tf

    examples = [np.array([5, 6, 7, 1]), np.array([8, 9, 1]), np.array([10, 11, 12, 13, 14, 1])]
    length = sum(map(len, examples)) + 2
    ds = tf.data.Dataset.from_generator(lambda: ({"targets": e.astype(np.int32)} for e in examples),
                                        output_signature={"targets": tf.TensorSpec([None], tf.int32)})
    packed = next(iter(seqio.LMFeatureConverter(pack=True)(ds, {"targets": length}).as_numpy_iterator()))
    ours = token_rows.lm_row(examples, length=length, start_id=0)
    assert ours.keys() == packed.keys()
    for key in ours:
        np.testing.assert_array_equal(ours[key], packed[key], err_msg=key)
        assert ours[key].dtype == packed[key].dtype, key


def test_rows_cut_documents_and_cover_the_stream():
    docs = [np.arange(10, 15), np.arange(20, 23), np.arange(30, 40)]  # stream lengths 6, 4, 11
    starts = [0, 6, 10]
    rows = []
    for row in range(token_rows.num_rows(21, 8)):
        span = token_rows.row_span(row, length=8, stream_tokens=21)
        rows.append(token_rows.lm_row(token_rows.pieces_of_row(docs, starts, span=span, eos_id=1), length=8,
                                      start_id=0))
    stream = np.concatenate([np.append(d, 1) for d in docs])
    real = np.concatenate([r["decoder_target_tokens"][r["decoder_loss_weights"] > 0] for r in rows])
    np.testing.assert_array_equal(real, stream)
    # Row 1 holds the end of doc 1 (positions from 0, a new segment) and the start of doc 2.
    np.testing.assert_array_equal(rows[1]["decoder_segment_ids"], [1, 1, 2, 2, 2, 2, 2, 2])
    np.testing.assert_array_equal(rows[1]["decoder_positions"], [0, 1, 0, 1, 2, 3, 4, 5])
    np.testing.assert_array_equal(rows[1]["decoder_input_tokens"][:3], [0, 22, 0])
    assert rows[-1]["decoder_loss_weights"].sum() == 21 - 16


def test_mixing_schedule_keeps_rates_and_is_positional():
    counts = mixing.apportion([1.0, 3.0])
    assert counts.tolist() == [mixing.BLOCK // 4, 3 * mixing.BLOCK // 4]
    positions = np.arange(3 * mixing.BLOCK + 100)
    tasks, uses = mixing.schedule(positions, counts=counts, seed=4)
    for k in (0, 1):
        np.testing.assert_array_equal(uses[tasks == k], np.arange((tasks == k).sum()))  # each use once, in order
    assert (tasks[:3 * mixing.BLOCK] == 1).sum() == 3 * counts[1]
    tail_tasks, tail_uses = mixing.schedule(positions[-50:], counts=counts, seed=4)
    np.testing.assert_array_equal(tail_tasks, tasks[-50:])
    np.testing.assert_array_equal(tail_uses, uses[-50:])
    with pytest.raises(ValueError, match="resolution"):
        mixing.apportion([1.0, 1e-6])


# ------------------------------------------------------------------------------ a prepared directory of ids


def doc_length(i: int) -> int:
    return 1 + (i * 13) % 45  # some documents longer than a row


def write_id_directory(out, spm_model, *, num_docs=NUM_DOCS, num_shards=3) -> None:
    """A prepared directory (no index yet) whose document i is the token i + 3 repeated."""
    import tensorflow as tf

    out.mkdir(parents=True)
    shutil.copy(spm_model, out / "spm.model")
    for s in range(num_shards):
        with tf.io.TFRecordWriter(str(out / f"train-{s:05d}-of-{num_shards:05d}.tfrecord")) as writer:
            for i in range(s, num_docs, num_shards):
                feature = {"targets": tf.train.Feature(int64_list=tf.train.Int64List(value=[i + 3] * doc_length(i))),
                           "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i]))}
                writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    split = {"pattern": "train-*-of-*.tfrecord", "num_shards": num_shards, "num_examples": num_docs,
             "num_tokens": sum(map(doc_length, range(num_docs)))}
    (out / "metadata.json").write_text(json.dumps({"format_version": 1, "vocab_size": 512, "vocabulary": "spm.model",
                                                   "splits": {"train": split}}))


@pytest.fixture(scope="module")
def id_dir(small_data_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("indexed") / "ids"
    write_id_directory(out, small_data_dir / "spm.model")
    index_command.index_directory(str(out), log=lambda _: None)
    return out


@pytest.fixture(scope="module")
def id_task(id_dir) -> str:
    return task_factories.lm_task(name="test_indexed_ids", data_dir=str(id_dir))


def make(task, *, shard=(0, 1), num_epochs=3, host_batch=4, seed=7, **kwargs):
    config = task_access.DataConfig(task, sequence_length=SEQ, batch_size=host_batch * shard[1], seed=seed, **kwargs)
    plan, why = index_plan.plan(config)
    assert plan is not None, why
    return indexed_input.IndexedBatchIterator(plan, num_epochs=num_epochs, host_batch_size=host_batch,
                                              shard_index=shard[0], num_shards=shard[1])


def expected_tokens(eos_id: int = 1) -> Counter:
    counts = Counter({i + 3: doc_length(i) for i in range(NUM_DOCS)})
    counts[eos_id] += NUM_DOCS
    return counts


def test_prepare_writes_the_index_the_index_command_writes(small_data_dir, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(small_data_dir, copy)
    written = {s: np.load(copy / record_index.index_file_name(s)) for s in ("train", "validation")}
    metadata = json.loads((copy / "metadata.json").read_text())
    for entry in metadata["splits"].values():
        del entry["index"]
    (copy / "metadata.json").write_text(json.dumps(metadata))
    index_command.index_directory(str(copy), log=lambda _: None)
    rebuilt = json.loads((copy / "metadata.json").read_text())
    for split, index in written.items():
        np.testing.assert_array_equal(np.load(copy / record_index.index_file_name(split)), index)
        records = record_index.SplitRecords(str(copy), split, rebuilt["splits"][split])
        in_order = [r for p in records.shard_paths for r in tfrecord_stream.iter_records(p)]
        assert records.read(range(records.num_records)) == in_order


def test_epochs_cover_every_token_once_in_fresh_orders_with_known_lengths(id_task, monkeypatch):
    def no_counting(*args, **kwargs):
        raise AssertionError("the index path must not count batches")

    monkeypatch.setattr(input_pipeline, "count_batches", no_counting)
    iterator = make(id_task)
    stream_tokens = sum(doc_length(i) + 1 for i in range(NUM_DOCS))
    rows = -(-stream_tokens // SEQ)
    assert iterator.steps_per_epoch == -(-rows // 4)
    epochs = split_epochs(iterator)  # and no batch after the last end of epoch
    assert [len(e) for e in epochs] == [iterator.steps_per_epoch] * 3
    for batches in epochs:
        assert real_tokens(batches) == expected_tokens()
    firsts = {tuple(e[0]["decoder_target_tokens"][0]) for e in epochs}
    assert len(firsts) == 3, "epochs repeated an order"
    assert iterator.last_epoch_stats == {"rows": rows, "tokens": stream_tokens}


@pytest.mark.parametrize("num_shards", [1, 4])
def test_shards_split_each_global_batch_and_step_together(id_task, num_shards):
    """Data shards (processes) read disjoint rows; their batches of a step are the 1-shard run's global batch."""
    single = list(make(id_task, host_batch=8, num_epochs=1))
    shards = [list(make(id_task, shard=(s, num_shards), host_batch=8 // num_shards, num_epochs=1))
              for s in range(num_shards)]
    assert {len(s) for s in shards} == {len(single)}
    for step, batch in enumerate(single):
        stacked = {k: np.concatenate([s[step][k] for s in shards]) for k in batch}
        for key in batch:
            np.testing.assert_array_equal(stacked[key], batch[key])
    assert real_tokens([b for s in shards for b in s]) == expected_tokens()


@pytest.mark.parametrize("taken", [0, 1, 5, 11, 12, 25])
def test_restore_continues_exactly_and_reads_only_the_next_batch(id_task, taken, monkeypatch):
    reference = make(id_task, num_epochs=3)
    whole = list(reference)
    first = make(id_task)
    for _ in range(taken):
        next(first)
    state = json.loads(json.dumps(first.get_state()))
    resumed = make(id_task)
    reads = []
    read_batch = resumed._read_batch
    monkeypatch.setattr(resumed, "_read_batch", lambda *key: reads.append(key) or read_batch(*key))
    resumed.set_state(state)
    batch = next(resumed)
    assert reads[0] == (taken // resumed.steps_per_epoch, taken % resumed.steps_per_epoch)
    assert len(reads) <= 2, "restoring read more than the next batch (and the one after, read ahead)"
    rest = [batch, *resumed]
    assert len(rest) == len(whole) - taken
    assert_same_batches(whole[taken:], rest)


def test_positions_are_global_so_another_shard_count_resumes(id_task):
    one = make(id_task, host_batch=8)
    for _ in range(3):
        next(one)
    halves = [make(id_task, shard=(s, 2), host_batch=4) for s in range(2)]
    for h in halves:
        h.set_state(one.get_state())
    batch = next(one)
    np.testing.assert_array_equal(np.concatenate([next(h)["decoder_target_tokens"] for h in halves]),
                                  batch["decoder_target_tokens"])


def test_states_it_cannot_continue_are_refused(id_task):
    iterator = make(id_task)
    with pytest.raises(indexed_input.DataPositionError, match="streaming reader"):
        iterator.set_state({"epoch": 0, "batches_in_epoch": 3, "steps_in_epoch": None, "shard_index": 0,
                            "num_shards": 1})
    with pytest.raises(indexed_input.DataPositionError, match="BATCH_SIZE"):
        iterator.set_state({**make(id_task, host_batch=2).get_state()})
    with pytest.raises(indexed_input.DataPositionError, match="rows of data"):  # re-prepared: other rows, same steps
        iterator.set_state({**iterator.get_state(), "rows": [iterator.rows[0] - 1]})


def test_unshuffled_reads_rows_in_stream_order(id_task):
    batches = list(make(id_task, num_epochs=1, shuffle=False))
    real = [b["decoder_target_tokens"][b["decoder_loss_weights"] > 0] for b in batches]
    # Index order is shard by shard; within the index, documents run 0, 3, 6, ... then 1, 4, ...
    order = [i for s in range(3) for i in range(s, NUM_DOCS, 3)]
    stream = np.concatenate([np.append(np.full(doc_length(i), i + 3), 1) for i in order])
    np.testing.assert_array_equal(np.concatenate(real), stream)


@pytest.fixture(scope="module")
def mixture_of_two(id_dir, tmp_path_factory, small_data_dir):
    other = tmp_path_factory.mktemp("indexed_other") / "ids"
    write_id_directory(other, small_data_dir / "spm.model", num_docs=NUM_DOCS)
    index_command.index_directory(str(other), log=lambda _: None)
    a = task_factories.lm_task(name="test_indexed_mix_a", data_dir=str(id_dir))
    b = task_factories.lm_task(name="test_indexed_mix_b", data_dir=str(other))
    return task_factories.mixture(name="test_indexed_mix", tasks=[(a, 1.0), (b, 3.0)])


def test_mixture_reads_by_index_at_its_rates_and_resumes_exactly(mixture_of_two):
    iterator = make(mixture_of_two, num_epochs=2)
    counts = mixing.apportion([1.0, 3.0])
    # One epoch: as many positions as the scarcer task (per unit of rate) fills in one of its epochs.
    assert iterator.positions_per_epoch == min(r * mixing.BLOCK // c for r, c in zip(iterator.rows, counts))
    assert iterator.positions_per_epoch == iterator.rows[1] * mixing.BLOCK // counts[1]  # b: 3/4 of the rows
    batches = list(iterator)
    taken = [entry for e in range(2) for b in range(iterator.steps_per_epoch) for entry in iterator.rows_of_batch(e, b)]
    # Rates are exact per block of mixing.BLOCK positions (test above); over these 240 the share is sampled.
    share = Counter(task for task, _ in taken)
    assert abs(share[1] / len(taken) - 0.75) < 0.1
    for task in (0, 1):  # each task's rows: a permutation of all of them, then the next epoch's
        rows = [row for t, row in taken if t == task]
        first = rows[:iterator.rows[task]]
        assert len(set(first)) == len(first)
    resumed = make(mixture_of_two, num_epochs=2)
    resumed.set_state({**resumed.get_state(), "epoch": 1, "batches_in_epoch": 3})
    np.testing.assert_array_equal(next(resumed)["decoder_target_tokens"],
                                  batches[iterator.steps_per_epoch + 3]["decoder_target_tokens"])


def test_what_is_streamed_says_why(id_task, small_data_dir, tmp_path):
    def why(task, **kwargs):
        plan, reason = index_plan.plan(task_access.DataConfig(task, sequence_length=SEQ, **kwargs))
        assert plan is None
        return reason

    corruption = task_factories.span_corruption_task(name="test_indexed_sc", data_dir=str(small_data_dir))
    assert "not an lm_task" in why(corruption, feature_converter="lm")
    assert "'enc_dec'" in why(id_task, feature_converter="enc_dec", inputs_length=16)
    assert "pack=False" in why(id_task, pack=False)
    assert "offline cache" in why(id_task, use_cached=True)
    assert "reader='stream'" in why(id_task, reader="stream")
    (tmp_path / "text.jsonl").write_text('{"text": "some raw text"}\n')
    text = task_factories.text_task(name="test_indexed_text", splits={"train": str(tmp_path / "text.jsonl")},
                                    vocabulary="byte")
    assert "tokenizes raw text while reading" in why(text)
    bare = tmp_path / "bare"
    write_id_directory(bare, small_data_dir / "spm.model", num_docs=9)
    assert f"t5x-lite index {bare}" in why(task_factories.lm_task(name="test_indexed_bare", data_dir=str(bare)))
    with pytest.raises(ConfigValueError, match="reader='index'.*not an lm_task"):
        index_plan.plan(task_access.DataConfig(corruption, sequence_length=SEQ, reader="index"))


def test_damaged_record_and_stale_index_are_named(id_dir, tmp_path):
    copy = tmp_path / "ids"
    shutil.copytree(id_dir, copy)
    entry = json.loads((copy / "metadata.json").read_text())["splits"]["train"]
    shard = copy / "train-00001-of-00003.tfrecord"
    data = bytearray(shard.read_bytes())
    data[30] ^= 0xFF
    shard.write_bytes(bytes(data))
    records = record_index.SplitRecords(str(copy), "train", entry)
    with pytest.raises(tfrecord_stream.CorruptRecordError, match="train-00001-of-00003.tfrecord"):
        records.read([records.shard_starts[1]])
    entry["index"]["records_per_shard"][0] -= 1
    with pytest.raises(record_index.RecordIndexError, match="t5x-lite index"):
        record_index.SplitRecords(str(copy), "train", entry)


def test_index_command_refuses_a_directory_that_is_not_prepared(tmp_path, capsys):
    assert index_command.main([str(tmp_path)]) == 2
    assert "not a prepared directory" in capsys.readouterr().err
