"""input_pipeline: prepare MB/s, packed-batch tokens/s vs. the train step's, epoch counting, iterator state.

1. `prepare`: the Python standard library's source (or, with --quick, its json and urllib
   packages) tokenized into TFRecords (and their offset index) with all cores; MB/s of raw text
   for the whole command (vocabulary training included) and for tokenizing + writing alone.
2. Pipelines: the streaming `BatchIterator` (seqio task, packing) and the index path's
   `IndexedBatchIterator` over that data (packed rows of --seq_len, --batch_size rows), each
   timed over --batches batches after the first; tokens/s counts every row position. The index
   path is timed twice: with its own Example parser (data/records/example_codec.py, no
   TensorFlow) and with `tf.io.parse_example` in its place (`tf_parse_targets`). The train
   step's consumption is `Trainer.train_step` of the quickstart's tiny decoder and of the
   throughput benchmark's d512 decoder at the same batch shape (the fastest and a typical
   consumer); the ratio is pipeline tokens/s over step tokens/s.
3. Planned epochs (streaming): the time of the counting pass of one epoch, next to reading it.
4. Iterator checkpoint: the state's size as JSON, and the time of `set_state` + the first
   batch at several positions. Streaming rebuilds the epoch and skips what was taken, so it is
   timed at --restore_positions. The index path seeks, so it is timed at
   --index_restore_positions (up to 10^6 batches into one epoch): as the corpus is far smaller
   than that, it reads a split whose index lists the corpus's records K times over (the
   shards themselves, read at the indexed offsets, are the prepared ones), so one epoch
   holds more batches than the last position.
"""

from __future__ import annotations

import json
import os
import tempfile
from unittest import mock

import numpy as np

from bench import common

DEFAULTS = {"seq_len": 256, "batch_size": 16, "batches": 200, "step_batches": 5,
            "restore_positions": "0,100,400,800", "index_restore_positions": "0,1000,100000,1000000"}
QUICK = {"batches": 20, "step_batches": 2, "restore_positions": "0,10,40", "index_restore_positions": "0,1000,100000"}


def add_arguments(parser) -> None:
    for key in ("seq_len", "batch_size", "batches", "step_batches"):
        parser.add_argument(f"--{key}", type=int, help=f"default {DEFAULTS[key]}")
    parser.add_argument("--restore_positions",
                        help=f"batches taken before restoring (default {DEFAULTS['restore_positions']})")
    parser.add_argument("--index_restore_positions",
                        help=f"index path: batches into the epoch (default {DEFAULTS['index_restore_positions']})")
    parser.add_argument("--data_dir", help="a prepared directory to read instead of preparing one")


def prepare_corpus(out_dir: str, quick: bool) -> dict:
    import sysconfig

    from t5x_lite.data.preparation import corpus, prepare

    stdlib = sysconfig.get_paths()["stdlib"]
    inputs = [os.path.join(stdlib, "json"), os.path.join(stdlib, "urllib")] if quick else [corpus.PYTHON_STDLIB]
    return prepare.prepare(inputs=inputs, out_dir=out_dir, vocab_size=512 if quick else 4096, num_shards=4,
                           validation_fraction=0.27 if quick else 0.05, log=lambda _: None)  # quick: 10 files


def iterator_for(task: str, s: dict, **kwargs):
    from t5x_lite.data import task_access
    from t5x_lite.data.streaming import input_pipeline

    config = task_access.DataConfig(task, sequence_length=s["seq_len"], batch_size=s["batch_size"], seed=0)
    return input_pipeline.BatchIterator(config, num_epochs=None, host_batch_size=s["batch_size"], **kwargs)


def indexed_iterator_for(task: str, s: dict):
    from t5x_lite.data import task_access
    from t5x_lite.data.indexed import index_plan, indexed_input

    config = task_access.DataConfig(task, sequence_length=s["seq_len"], batch_size=s["batch_size"], seed=0,
                                    reader="index")
    plan, _ = index_plan.plan(config)
    return indexed_input.IndexedBatchIterator(plan, num_epochs=None, host_batch_size=s["batch_size"])


def tf_parse_targets(records: list[bytes]) -> list[np.ndarray]:
    """`record_index.parse_targets` as TensorFlow does it: one `tf.io.parse_example` call for all."""
    from t5x_lite.tf_setup import import_tensorflow

    if not records:
        return []
    tf = import_tensorflow()
    parsed = tf.io.parse_example(records, {"targets": tf.io.RaggedFeature(tf.int64)})["targets"]
    values, splits = parsed.flat_values.numpy(), parsed.row_splits.numpy()
    return [values[splits[i]:splits[i + 1]] for i in range(len(records))]


def pipeline_tokens_per_second(task: str, s: dict, make=iterator_for) -> tuple[float, float]:
    """(tokens/s over all row positions, fraction of positions holding real tokens)."""
    iterator = make(task, s)
    next(iterator)  # the pipeline's start-up is not throughput
    batches, seconds = common.timed(lambda: [next(iterator) for _ in range(s["batches"])])
    real = float(np.mean([b["decoder_loss_weights"].mean() for b in batches]))
    return s["batches"] * s["batch_size"] * s["seq_len"] / seconds, real


def step_tokens_per_second(model_config, s: dict) -> float:
    import jax

    from t5x_lite.parallel import partitioning

    trainer = common.make_trainer(model_config)
    batch = common.make_batch(model_config, batch=s["batch_size"], length=s["seq_len"], packed_segments=4)
    global_batch = partitioning.host_batch_to_global(batch, trainer.batch_sharding)
    state = trainer.init_state(jax.random.PRNGKey(0), batch)
    rng = jax.random.PRNGKey(1)
    state, metrics = trainer.train_step(state, global_batch, rng)  # compile
    jax.block_until_ready(metrics)

    def steps():
        nonlocal state, metrics
        for _ in range(s["step_batches"]):
            state, metrics = trainer.train_step(state, global_batch, rng)
        jax.block_until_ready(metrics)

    _, seconds = common.timed(steps)
    return s["step_batches"] * s["batch_size"] * s["seq_len"] / seconds


def models(vocab_size: int, seq_len: int, quick: bool):
    from t5x_lite.models.decoder_only import DecoderConfig

    tiny = DecoderConfig(vocab_size=vocab_size, emb_dim=128, num_heads=4, num_kv_heads=4, head_dim=32,
                         mlp_dim=512, num_layers=4, max_len=seq_len)
    d512 = DecoderConfig(vocab_size=vocab_size, emb_dim=512, num_heads=8, num_kv_heads=8, head_dim=64,
                         mlp_dim=1408, num_layers=4, max_len=seq_len)
    return {"tiny decoder (quickstart)": tiny} if quick else {"tiny decoder (quickstart)": tiny,
                                                              "d512 4-layer decoder (throughput bench)": d512}


def restore_times(task: str, s: dict) -> list[tuple[int, float, int]]:
    """(position, seconds for set_state + first batch, state bytes) at each position."""
    out = []
    for position in common.ints(s["restore_positions"]):
        first = iterator_for(task, s)
        for _ in range(position):
            next(first)
        state = first.get_state()
        resumed = iterator_for(task, s)
        _, seconds = common.timed(lambda: (resumed.set_state(state), next(resumed)))
        out.append((position, seconds, len(json.dumps(state))))
    return out


def repeated_directory(data_dir: str, out_dir: str, *, repeat: int) -> None:
    """A prepared directory whose train index lists `data_dir`'s records `repeat` times over,
    shard by shard (its shards and vocabulary are links to `data_dir`'s)."""
    from t5x_lite.data.records import prepared_dataset, record_index

    os.makedirs(out_dir)
    metadata = prepared_dataset.read_metadata(data_dir)
    for name in os.listdir(data_dir):
        if name != prepared_dataset.METADATA_FILE and not name.endswith(".index.npy"):
            os.symlink(os.path.abspath(os.path.join(data_dir, name)), os.path.join(out_dir, name))
    entry = metadata["splits"]["train"]
    index = np.load(os.path.join(data_dir, entry["index"]["file"]))
    starts = np.concatenate([[0], np.cumsum(entry["index"]["records_per_shard"])])
    offsets, lengths = [], []
    for a, b in zip(starts[:-1], starts[1:]):
        offsets.append(np.tile(index[a:b, 0], repeat))
        lengths.append(np.tile(np.diff(index[a:b + 1, 1]), repeat))
    repeated = np.stack([np.concatenate([*offsets, [0]]),
                         np.concatenate([[0], np.cumsum(np.concatenate(lengths))])], axis=1).astype(np.int64)
    counts = [c * repeat for c in entry["index"]["records_per_shard"]]
    entry["index"] = record_index.write_index(out_dir, "train", repeated, counts)
    entry["num_examples"] *= repeat
    entry["num_tokens"] *= repeat
    prepared_dataset.write_metadata(out_dir, metadata)


def index_restore_times(data_dir: str, tmp: str, s: dict) -> tuple[list[tuple[int, float, int]], int, int]:
    """(position, seconds for set_state + first batch, state bytes) for the index path, the
    repetition K and the epoch's batches."""
    from t5x_lite.data import task_factories
    from t5x_lite.data.records import prepared_dataset

    positions = common.ints(s["index_restore_positions"])
    stream = prepared_dataset.read_metadata(data_dir)["splits"]["train"]["index"]["stream_tokens"]
    repeat = max(1, -(-(max(positions) + 1) * s["batch_size"] * s["seq_len"] // stream))
    big = os.path.join(tmp, f"repeated_{repeat}")
    repeated_directory(data_dir, big, repeat=repeat)
    task = task_factories.lm_task(name="bench_input_pipeline_repeated", data_dir=big)
    out = []
    for position in positions:
        resumed = indexed_iterator_for(task, s)
        state = {**resumed.get_state(), "epoch": 0, "batches_in_epoch": position}
        _, seconds = common.timed(lambda: (resumed.set_state(state), next(resumed)))
        resumed.close()
        out.append((position, seconds, len(json.dumps(state))))
    return out, repeat, indexed_iterator_for(task, s).steps_per_epoch


def run(args, command: str) -> dict:
    from t5x_lite.data import task_access, task_factories
    from t5x_lite.data.records import record_index
    from t5x_lite.data.streaming import input_pipeline

    s = common.resolve(args, DEFAULTS, QUICK)
    print(common.header(command))
    print(common.settings_line(s))
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = args.data_dir
        if data_dir is None:
            data_dir = os.path.join(tmp, "data")
            common.progress("preparing the corpus")
            result = prepare_corpus(data_dir, args.quick)
            print("\nprepare (all cores):\n")
            print(common.table(["input", "MB", "whole command MB/s", "tokenize + write MB/s", "seconds"], [[
                "python stdlib json+urllib" if args.quick else "python stdlib", f"{result['input_mb']:.1f}",
                f"{result['input_mb'] / result['seconds']:.2f}", f"{result['tokenize_mb_per_s']:.2f}",
                f"{result['seconds']:.1f}"]]))
        task = task_factories.lm_task(name="bench_input_pipeline", data_dir=data_dir)
        vocab_size = task_access.vocabulary_size(task_access.DataConfig(task))

        common.progress("timing the input pipelines")
        pipeline_tps, real_fraction = pipeline_tokens_per_second(task, s)
        index_tps, index_real = pipeline_tokens_per_second(task, s, make=indexed_iterator_for)
        with mock.patch.object(record_index, "parse_targets", tf_parse_targets):
            index_tf_tps, _ = pipeline_tokens_per_second(task, s, make=indexed_iterator_for)
        rows = []
        for name, model_config in models(-(-vocab_size // 128) * 128, s["seq_len"], args.quick).items():
            common.progress(f"timing train steps of the {name}")
            step_tps = step_tokens_per_second(model_config, s)
            rows.append([name, f"{step_tps:,.0f}", f"{pipeline_tps:,.0f}", f"{pipeline_tps / step_tps:.1f}x",
                         f"{index_tps:,.0f}", f"{index_tps / step_tps:.1f}x", f"{index_tf_tps:,.0f}"])
        print(f"\npipelines vs. train step ({s['batch_size']} x {s['seq_len']} packed rows; positions holding "
              f"tokens: streaming {100 * real_fraction:.1f}%, index {100 * index_real:.1f}%):\n")
        print(common.table(["consumer", "step tokens/s", "streaming tokens/s", "streaming / step",
                            "index tokens/s", "index / step", "index, tf.io.parse_example tokens/s"], rows))

        common.progress("timing an epoch: counting pass and reading")
        cfg = task_access.DataConfig(task, sequence_length=s["seq_len"], batch_size=s["batch_size"], seed=0)
        (steps, stats), count_seconds = common.timed(lambda: input_pipeline.count_batches(
            cfg, epoch=0, host_batch_size=s["batch_size"], shard_index=0, num_shards=1))
        dataset = input_pipeline.epoch_dataset(cfg, epoch=0, host_batch_size=s["batch_size"], shard_index=0,
                                               num_shards=1)
        _, read_seconds = common.timed(lambda: sum(1 for _ in dataset.as_numpy_iterator()))
        print("\nplanned epochs: counting pass vs. reading the same epoch:\n")
        print(common.table(["epoch batches", "examples", "count pass s", "read epoch s"],
                           [[steps, stats["examples"], f"{count_seconds:.2f}", f"{read_seconds:.2f}"]]))

        common.progress("timing iterator restores")
        restores = restore_times(task, s)
        print("\niterator checkpoint, streaming: state size and restore time (set_state + first batch):\n")
        print(common.table(["position (batches)", "state bytes (JSON)", "restore s"],
                           [[p, b, f"{t:.2f}"] for p, t, b in restores]))
        common.progress("timing restores by index")
        index_restores, repeat, epoch_batches = index_restore_times(data_dir, tmp, s)
        print(f"\niterator checkpoint, by index (the corpus's records listed {repeat} times over: "
              f"{epoch_batches:,} batches per epoch): state size and restore time (set_state + first batch):\n")
        print(common.table(["position (batches)", "state bytes (JSON)", "restore s"],
                           [[p, b, f"{t:.4f}"] for p, t, b in index_restores]))
    return {"pipeline_tokens_per_second": pipeline_tps, "index_tokens_per_second": index_tps,
            "index_tf_parser_tokens_per_second": index_tf_tps}
