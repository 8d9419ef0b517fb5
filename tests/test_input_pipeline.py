"""The seqio batch iterator: epochs, padding of the last batch, checkpointable state, shards."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from t5x_lite import config, data, input_pipeline

SEQ, BATCH = 64, 8


@pytest.fixture(scope="module")
def task(small_data_dir) -> str:
    return config.lm_task(name="test_small_lm", data_dir=str(small_data_dir))


def make_iterator(task: str, *, num_epochs=2, shuffle=True, shard=(0, 1)) -> input_pipeline.BatchIterator:
    cfg = data.DataConfig(task, sequence_length=SEQ, batch_size=BATCH, shuffle=shuffle, seed=3)
    return input_pipeline.BatchIterator(cfg, num_epochs=num_epochs, host_batch_size=BATCH,
                              shard_index=shard[0], num_shards=shard[1])


def real_tokens(batches) -> Counter:
    counts: Counter = Counter()
    for b in batches:
        counts.update(b["decoder_target_tokens"][b["decoder_loss_weights"] > 0].tolist())
    return counts


def split_epochs(iterator: input_pipeline.BatchIterator) -> list[list[dict]]:
    epochs, current = [], []
    for batch in iterator:
        current.append(batch)
        if iterator.end_of_epoch:
            epochs.append(current)
            current = []
    assert current == [], "batches after the last end_of_epoch"
    return epochs


def test_each_epoch_sees_every_token_once_in_a_new_order(task):
    reference = real_tokens(make_iterator(task, num_epochs=1, shuffle=False))
    epochs = split_epochs(make_iterator(task, num_epochs=2))
    assert len(epochs) == 2
    assert real_tokens(epochs[0]) == reference
    assert real_tokens(epochs[1]) == reference
    first_rows = [e[0]["decoder_target_tokens"] for e in epochs]
    assert not np.array_equal(*first_rows), "epoch 2 repeated epoch 1's order"
    for batch in epochs[0] + epochs[1]:
        assert batch["decoder_target_tokens"].shape == (BATCH, SEQ)


def test_same_seed_same_stream(task):
    a = list(make_iterator(task, num_epochs=1))
    b = list(make_iterator(task, num_epochs=1))
    assert len(a) == len(b)
    for x, y in zip(a, b):
        for key in x:
            np.testing.assert_array_equal(x[key], y[key])


@pytest.mark.parametrize("taken", [0, 3, "end_of_epoch_0", "mid_epoch_1"])
def test_restored_state_continues_the_same_stream(task, taken):
    full = list(make_iterator(task))
    per_epoch = len(split_epochs(make_iterator(task))[0])
    n = {"end_of_epoch_0": per_epoch, "mid_epoch_1": per_epoch + 2}.get(taken, taken)
    first = make_iterator(task)
    for _ in range(n):
        next(first)
    state = first.get_state()
    assert len(repr(state)) < 200  # two counters and the shard, whatever the buffer sizes

    resumed = make_iterator(task)
    resumed.set_state(state)
    rest = list(resumed)
    assert len(rest) == len(full) - n
    for x, y in zip(full[n:], rest):
        for key in x:
            np.testing.assert_array_equal(x[key], y[key])


def test_last_batch_is_padded_with_zero_weight_rows(task):
    batches = list(make_iterator(task, num_epochs=1, shuffle=False))
    last = batches[-1]
    assert last["decoder_target_tokens"].shape == (BATCH, SEQ)
    empty_rows = (last["decoder_loss_weights"].sum(axis=1) == 0).sum()
    full_rows = sum(int((b["decoder_loss_weights"].sum(axis=1) > 0).sum()) for b in batches)
    assert full_rows + empty_rows == len(batches) * BATCH


def test_shards_partition_the_split(task):
    whole = real_tokens(make_iterator(task, num_epochs=1, shuffle=False))
    shards = [real_tokens(make_iterator(task, num_epochs=1, shuffle=False, shard=(i, 2))) for i in range(2)]
    assert shards[0] + shards[1] == whole
    assert shards[0] and shards[1]


def test_state_of_another_shard_is_refused(task):
    iterator = make_iterator(task, shard=(1, 2))
    with pytest.raises(ValueError, match="shard 0 of 1"):
        iterator.set_state(make_iterator(task).get_state())


def test_unknown_task_lists_known_ones():
    with pytest.raises(ValueError, match="No seqio task or mixture named 'nope'"):
        data.get_task("nope")
