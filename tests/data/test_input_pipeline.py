"""The seqio batch iterator: epochs, padding of the last batch, checkpointable state, shards."""

from __future__ import annotations

import functools
import threading
from collections import Counter

import numpy as np
import pytest

from t5x_lite.data import task_access, task_factories
from t5x_lite.data.streaming import input_pipeline
from t5x_lite.errors import ConfigValueError
from t5x_lite.models import decoder_only
from t5x_lite.parallel import partitioning
from t5x_lite.training import trainer as trainer_lib
from t5x_lite.training import validation
from t5x_lite.training.periods import Period, parse_period

SEQ, BATCH = 64, 8


@pytest.fixture(scope="module")
def task(small_data_dir) -> str:
    return task_factories.lm_task(name="test_small_lm", data_dir=str(small_data_dir))


def make_iterator(task: str, *, num_epochs=2, shuffle=True, shard=(0, 1)) -> input_pipeline.BatchIterator:
    cfg = task_access.DataConfig(task, sequence_length=SEQ, batch_size=BATCH, shuffle=shuffle, seed=3)
    return input_pipeline.BatchIterator(cfg, num_epochs=num_epochs, host_batch_size=BATCH,
                              shard_index=shard[0], num_shards=shard[1])


def real_tokens(batches) -> Counter:
    counts: Counter = Counter()
    for b in batches:
        counts.update(b["decoder_target_tokens"][b["decoder_loss_weights"] > 0].tolist())
    return counts


def assert_same_batches(expected: list[dict], actual: list[dict]) -> None:
    for x, y in zip(expected, actual, strict=True):
        assert x.keys() == y.keys()
        for key in x:
            np.testing.assert_array_equal(x[key], y[key])


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
    assert_same_batches(a, b)


@pytest.fixture(scope="module")
def whole_stream(task):
    """(every batch of the default iterator, batches per epoch), read once for the restore tests."""
    full = list(make_iterator(task))
    return full, len(split_epochs(make_iterator(task))[0])


@pytest.mark.parametrize("taken", [0, 3, "end_of_epoch_0", "mid_epoch_1"])
def test_restored_state_continues_the_same_stream(task, whole_stream, taken):
    full, per_epoch = whole_stream
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
    assert_same_batches(full[n:], rest)


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


def test_state_of_another_shard_count_is_refused(task):
    iterator = make_iterator(task, shard=(1, 2))
    with pytest.raises(ValueError, match="for 1 data shard.*this run reads 2"):
        iterator.set_state(make_iterator(task).get_state())


def test_process_0_state_restores_every_shard_of_the_same_count(task):
    """A checkpoint keeps process 0's state: shard 1 restored from it continues its own stream."""
    agree = lambda epoch, local_steps: 7  # what the processes would agree on (the largest count)
    shards = {i: input_pipeline.BatchIterator(
        task_access.DataConfig(task, sequence_length=SEQ, batch_size=BATCH, shuffle=True, seed=3), num_epochs=1,
        host_batch_size=BATCH // 2, shard_index=i, num_shards=2, plan_epochs=True, agree_on_steps=agree)
        for i in (0, 1)}
    full = [next(shards[1]) for _ in range(5)]
    for _ in range(2):
        next(shards[0])
    resumed = input_pipeline.BatchIterator(
        task_access.DataConfig(task, sequence_length=SEQ, batch_size=BATCH, shuffle=True, seed=3), num_epochs=1,
        host_batch_size=BATCH // 2, shard_index=1, num_shards=2, plan_epochs=True, agree_on_steps=agree)
    resumed.set_state(shards[0].get_state())
    assert_same_batches(full[2:], [next(resumed) for _ in range(3)])


def test_unknown_task_lists_known_ones():
    with pytest.raises(ValueError, match="No seqio task or mixture named 'nope'"):
        task_access.get_task("nope")


# ----------------------------------------------------------------- exact epochs, counted by ids

ID_SEQ, ID_BATCH, NUM_IDS, NUM_FILES, TOO_LONG = 32, 4, 90, 6, (7, 50)


def id_length(i: int) -> int:
    """Example i's length: varied, so packing fits a different number of examples per row."""
    return ID_SEQ + 5 if i in TOO_LONG else 1 + (i * 7) % 20


@pytest.fixture(scope="module")
def id_task(tmp_path_factory) -> str:
    """A task whose example i is the token i + 3 repeated: every token names its example."""
    import seqio
    import tensorflow as tf

    out = tmp_path_factory.mktemp("ids")
    for f in range(NUM_FILES):
        with tf.io.TFRecordWriter(str(out / f"train-{f:05d}-of-{NUM_FILES:05d}.tfrecord")) as writer:
            for i in range(f, NUM_IDS, NUM_FILES):
                feature = tf.train.Feature(int64_list=tf.train.Int64List(value=[i + 3] * id_length(i)))
                writer.write(tf.train.Example(features=tf.train.Features(feature={"targets": feature}))
                             .SerializeToString())
    name = "test_ids"
    if name in seqio.TaskRegistry.names():
        seqio.TaskRegistry.remove(name)
    seqio.TaskRegistry.add(
        name,
        source=seqio.TFExampleDataSource({"train": str(out / "train-*.tfrecord")},
                                         feature_description={"targets": tf.io.RaggedFeature(tf.int64)}),
        preprocessors=[seqio.map_over_dataset(lambda ex: {"targets": tf.cast(ex["targets"], tf.int32)})],
        output_features={"targets": seqio.Feature(seqio.PassThroughVocabulary(NUM_IDS + 3), add_eos=False)},
        shuffle_buffer_size=1000,
    )
    return name


def id_config(task: str, seed: int = 5) -> task_access.DataConfig:
    return task_access.DataConfig(task, sequence_length=ID_SEQ, batch_size=ID_BATCH, seed=seed)


def example_tokens(batches) -> Counter:
    """Token counts of the real (weighted) positions: token i + 3 appears once per token of example i."""
    return real_tokens(batches)


def expected_tokens(epochs: int) -> Counter:
    return Counter({i + 3: epochs * min(id_length(i), ID_SEQ) for i in range(NUM_IDS)})


def id_order(batches) -> list[int]:
    """Example ids in the order they first appear."""
    order: dict[int, None] = {}
    for b in batches:
        for row, weights in zip(b["decoder_target_tokens"], b["decoder_loss_weights"]):
            order.update((int(t) - 3, None) for t in row[weights > 0])
    return list(order)


@pytest.mark.parametrize("plan", [False, True])
def test_every_example_exactly_once_per_epoch_in_a_fresh_order(id_task, plan):
    iterator = input_pipeline.BatchIterator(id_config(id_task), num_epochs=3, host_batch_size=ID_BATCH,
                                            plan_epochs=plan)
    epochs = split_epochs(iterator)
    assert len(epochs) == 3
    for batches in epochs:
        assert example_tokens(batches) == expected_tokens(1)
    orders = [id_order(batches) for batches in epochs]
    assert len({tuple(o) for o in orders}) == 3, "an epoch repeated another's order"
    assert iterator.last_epoch_stats == {"examples": NUM_IDS, "truncated_targets": len(TOO_LONG)}


def test_seed_fixes_the_order(id_task):
    def first_epoch(seed):
        return id_order(list(input_pipeline.BatchIterator(id_config(id_task, seed), num_epochs=1,
                                                          host_batch_size=ID_BATCH)))

    assert first_epoch(5) == first_epoch(5)
    assert first_epoch(5) != first_epoch(6)


def host_batch_of(num_processes: int) -> int:
    return ID_BATCH // num_processes


@functools.lru_cache(maxsize=None)
def max_steps_over_shards(task: str, num_processes: int, epoch: int) -> int:
    """What the processes' all-gather of their step counts would agree on."""
    return max(input_pipeline.count_batches(id_config(task), epoch=epoch, host_batch_size=host_batch_of(num_processes),
                                            shard_index=i, num_shards=num_processes)[0]
               for i in range(num_processes))


def simulated_processes(task: str, num_processes: int, num_epochs: int) -> list[input_pipeline.BatchIterator]:
    """One planned iterator per simulated process; they agree on epoch lengths like processes do."""
    def agree(epoch, local_steps):
        return max_steps_over_shards(task, num_processes, epoch)

    return [input_pipeline.BatchIterator(id_config(task), num_epochs=num_epochs,
                                         host_batch_size=host_batch_of(num_processes), shard_index=i,
                                         num_shards=num_processes, plan_epochs=True, agree_on_steps=agree)
            for i in range(num_processes)]


def test_processes_read_disjoint_shards_and_step_together(id_task):
    """Four simulated processes (two run for real in tests/cluster/test_slurm.py and test_distributed.py)."""
    iterators = simulated_processes(id_task, 4, num_epochs=2)
    epochs: list[list[dict]] = [[]]
    per_process_epoch: list[list[Counter]] = [[Counter() for _ in iterators]]
    while True:
        batches = [next(it, None) for it in iterators]
        if all(b is None for b in batches):
            break
        assert all(b is not None for b in batches), "a process ran out before the others"
        # One global step: the processes' rows stacked are the global batch.
        global_batch = {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}
        assert global_batch["decoder_target_tokens"].shape == (ID_BATCH, ID_SEQ)
        epochs[-1].append(global_batch)
        for counts, b in zip(per_process_epoch[-1], batches):
            counts.update(real_tokens([b]))
        ends = {it.end_of_epoch for it in iterators}
        assert len(ends) == 1, "processes disagree on the end of the epoch"
        if ends == {True}:
            epochs.append([])
            per_process_epoch.append([Counter() for _ in iterators])
    assert epochs[-1] == [] and len(epochs) == 3
    for batches, per_process in zip(epochs[:2], per_process_epoch[:2]):
        assert example_tokens(batches) == expected_tokens(1)  # union: every example once
        ids = [set(c) for c in per_process]
        assert all(ids) and sum(map(len, ids)) == len(set().union(*ids)), "an example read by two processes"


def test_planned_restore_continues_exactly_even_while_padding(id_task):
    iterators = simulated_processes(id_task, 4, num_epochs=2)
    full = list(iterators[3])
    per_epoch = iterators[3].steps_in_epoch(0)
    assert sum(b["decoder_loss_weights"].sum() == 0 for b in full[:per_epoch]) >= 2, "no padding phase"
    for n in (1, per_epoch - 1, per_epoch + 2):
        first = simulated_processes(id_task, 4, num_epochs=2)[3]
        for _ in range(n):
            next(first)
        resumed = simulated_processes(id_task, 4, num_epochs=2)[3]
        resumed.set_state(first.get_state())
        rest = list(resumed)
        assert len(rest) == len(full) - n
        assert_same_batches(full[n:], rest)


def test_state_is_small_whatever_the_shuffle_buffer(id_task):
    import json

    iterator = input_pipeline.BatchIterator(id_config(id_task), num_epochs=None, host_batch_size=ID_BATCH,
                                            plan_epochs=True)
    for _ in range(5):
        next(iterator)
    state = json.dumps(iterator.get_state())
    assert len(state) < 120, state


def test_epoch_seeds_are_independent_of_neighbouring_seeds():
    seeds = {input_pipeline.epoch_seed(s, e) for s in range(20) for e in range(20)}
    assert len(seeds) == 400
    assert all(0 <= s < 2**31 for s in seeds)


def test_each_data_shard_has_its_own_seed_and_shard_0_keeps_the_single_process_one():
    """Every process's shard draws its own shuffle and preprocessor randomness; a single-process
    run (shard 0) reads what it read before shards had seeds."""
    seeds = {input_pipeline.epoch_seed(s, e, i) for s in range(5) for e in range(5) for i in range(8)}
    assert len(seeds) == 200
    legacy = int(np.random.SeedSequence([3, 1]).generate_state(1, np.uint32)[0] >> 1)
    assert input_pipeline.epoch_seed(3, 1, 0) == input_pipeline.epoch_seed(3, 1) == legacy


# ----------------------------------------------------------------- periods and data shards


@pytest.mark.parametrize("value, expected", [
    (0, Period(0)), (None, Period(0)), (500, Period(500)), ("500 steps", Period(500)),
    ("1 epoch", Period(1, "epochs")), (" 2 epochs ", Period(2, "epochs")),
])
def test_periods_parse(value, expected):
    assert parse_period(value, name="train.eval_period") == expected


@pytest.mark.parametrize("value", ["1.5 epochs", "epoch", "3 days", -1, True])
def test_bad_periods_name_the_flag(value):
    with pytest.raises(ConfigValueError, match="train.eval_period"):
        parse_period(value, name="train.eval_period")


def test_period_due():
    steps, epochs = Period(3), Period(2, "epochs")
    assert [s for s in range(1, 10) if steps.due(step=s, epochs_finished=0, end_of_epoch=False)] == [3, 6, 9]
    assert not epochs.due(step=4, epochs_finished=2, end_of_epoch=False)
    assert not epochs.due(step=4, epochs_finished=1, end_of_epoch=True)
    assert epochs.due(step=4, epochs_finished=2, end_of_epoch=True)
    assert not Period(0).due(step=5, epochs_finished=5, end_of_epoch=True)


def test_data_shards_follow_the_rows_each_process_holds():
    rows = {0: (0, 4), 1: (4, 8), 2: (8, 12), 3: (12, 16)}
    assert [partitioning.data_shard_from_rows(rows, p) for p in range(4)] == [(i, 4) for i in range(4)]
    # Processes 0/1 and 2/3 hold the same rows (the batch axes span only two of them): 2 shards.
    shared = {0: (0, 8), 1: (0, 8), 2: (8, 16), 3: (8, 16)}
    assert [partitioning.data_shard_from_rows(shared, p) for p in range(4)] == [(0, 2), (0, 2), (1, 2), (1, 2)]
    with pytest.raises(ValueError, match="uneven or overlapping"):
        partitioning.data_shard_from_rows({0: (0, 8), 1: (4, 12)}, 0)


def test_one_process_is_one_data_shard():
    import jax

    mesh = partitioning.make_mesh(axes=(("data", 2), ("fsdp", 4), ("tensor", 1)), devices=jax.devices()[:8])
    sharding = partitioning.batch_sharding(mesh, partitioning.rules_for_mesh(partitioning.DEFAULT_RULES, mesh))
    assert partitioning.process_data_shard(sharding, 16) == (0, 1, 16)


def test_validation_loss_does_not_depend_on_the_batch_size(task):
    """One unshuffled pass, the last batch padded and masked: the same loss at every batch size."""
    import jax
    import optax

    model = decoder_only.DecoderConfig(vocab_size=task_access.vocabulary_size(task_access.DataConfig(task)), emb_dim=32,
                                       num_heads=2, num_kv_heads=2, head_dim=16, mlp_dim=64, num_layers=2,
                                       max_len=SEQ)
    mesh = partitioning.make_mesh(axes=(("data", 1), ("fsdp", 1), ("tensor", 1)), devices=jax.devices()[:1])
    trainer = trainer_lib.Trainer(model=model.make_module(), optimizer=optax.sgd(0.1), learning_rate_fn=lambda s: 0.1,
                                  mesh=mesh, rules=partitioning.DEFAULT_RULES, clip_grad_norm=None)
    params = trainer.init_state(jax.random.PRNGKey(0), {"decoder_input_tokens": np.zeros((2, SEQ), np.int32)}).params
    results = [validation.validation_loss(trainer, params, task_access.DataConfig(task, split="validation", sequence_length=SEQ,
                                                               batch_size=b, shuffle=False))
               for b in (3, 8)]
    assert results[0]["tokens"] == results[1]["tokens"] > 0
    np.testing.assert_allclose(results[0]["loss"], results[1]["loss"], rtol=1e-5)


def test_each_epoch_is_counted_once(id_task, monkeypatch):
    """The loop asks for epoch 0's length up front; iterating must not count it again."""
    calls = Counter()
    count = input_pipeline.count_batches

    def counting(config, *, epoch, **kwargs):
        calls[epoch] += 1
        return count(config, epoch=epoch, **kwargs)

    monkeypatch.setattr(input_pipeline, "count_batches", counting)
    iterator = input_pipeline.BatchIterator(id_config(id_task), num_epochs=2, host_batch_size=ID_BATCH,
                                            plan_epochs=True)
    steps = iterator.steps_in_epoch(0)
    assert len(split_epochs(iterator)[0]) == steps
    assert calls == Counter({0: 1, 1: 1})


def test_closing_the_iterator_stops_a_count_in_progress(id_task, monkeypatch):
    """A run that ends mid-epoch exits without waiting for the next epoch's count: close() stops
    the background count at its next block of rows."""
    count = input_pipeline.count_batches
    started, stopped = threading.Event(), []

    def slow_count(config, *, cancel, **kwargs):
        started.set()
        assert cancel.wait(timeout=30), "close() never asked the count to stop"
        try:
            return count(config, cancel=cancel, **kwargs)
        except input_pipeline.CountCancelled:
            stopped.append(True)
            raise

    iterator = input_pipeline.BatchIterator(id_config(id_task), num_epochs=2, host_batch_size=ID_BATCH,
                                            plan_epochs=True)
    iterator.steps_in_epoch(0)
    monkeypatch.setattr(input_pipeline, "count_batches", slow_count)
    next(iterator)  # starts counting epoch 1 in the background
    assert started.wait(timeout=30)
    future = iterator._counting[1]
    iterator.close()
    with pytest.raises(input_pipeline.CountCancelled):
        future.result(timeout=30)
    assert stopped == [True]
