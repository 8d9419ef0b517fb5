"""Text tasks from raw jsonl / TFRecord files, the prefix-LM task's examples, and mixtures."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

from t5x_lite.config import parsing
from t5x_lite.errors import TaskDataError

DOCS = ["def add(a, b):\n    return a + b\n", "import json\nprint(json.dumps({'x': 1}))",
        "naïve café – ünïcode", "class A:\n    pass\n" * 3]


def _write_jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def _write_tfrecord(path: Path, texts: list[str | None], feature: str = "text") -> Path:
    import tensorflow as tf

    with tf.io.TFRecordWriter(str(path)) as writer:
        for text in texts:
            features = {} if text is None else {
                feature: tf.train.Feature(bytes_list=tf.train.BytesList(value=[text.encode()]))}
            writer.write(tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString())
    return path


def _examples(task, split="train", length=256, **kwargs) -> list[np.ndarray]:
    kwargs = {"shuffle": False, "num_epochs": 1, **kwargs}
    dataset = task.get_dataset(sequence_length={"targets": length}, split=split, **kwargs)
    return [ex["targets"] for ex in dataset.as_numpy_iterator()]


@pytest.fixture(params=["jsonl", "tfrecord"])
def text_files(request, tmp_path):
    """(file pattern, format) of two files holding DOCS (and nothing else)."""
    fmt = request.param
    for i, docs in enumerate([DOCS[:2], DOCS[2:]]):
        if fmt == "jsonl":
            _write_jsonl(tmp_path / f"part{i}.train.jsonl", [json.dumps({"body": d}) for d in docs])
        else:
            _write_tfrecord(tmp_path / f"part{i}.train.tfrecord", docs, feature="body")
    return str(tmp_path / f"*.train.{fmt}"), fmt


@pytest.mark.parametrize("vocabulary", ["spm", "byte"])
def test_text_task_tokenizes_documents(text_files, vocabulary, small_data_dir):
    from t5x_lite.data.tasks import text

    pattern, fmt = text_files
    vocab = str(small_data_dir / "spm.model") if vocabulary == "spm" else "byte"
    task = text.register_text_task(f"test_text_{fmt}_{vocabulary}", {"train": pattern}, vocab, text_field="body")
    vocab = task.output_features["targets"].vocabulary
    examples = _examples(task)
    assert all(ex[-1] == vocab.eos_id and vocab.eos_id not in ex[:-1].tolist() for ex in examples)
    assert sorted(ex[:-1].tolist() for ex in examples) == sorted(vocab.encode(d) for d in DOCS)
    assert sorted(vocab.decode(ex.tolist()) for ex in examples) == sorted(DOCS)
    if vocabulary == "byte":  # seqio's byte ids: the UTF-8 bytes shifted past pad, EOS and UNK
        assert sorted(ex[:-1].tolist() for ex in examples) == sorted([b + 3 for b in d.encode()] for d in DOCS)


def test_long_documents_are_split_to_the_targets_length(tmp_path):
    from t5x_lite.data.tasks import text

    doc = "0123456789" * 10
    _write_jsonl(tmp_path / "long.jsonl", [json.dumps({"text": doc})])
    task = text.register_text_task("test_text_long", {"train": str(tmp_path / "*.jsonl")}, "byte")
    examples = _examples(task, length=16)
    assert [len(ex) for ex in examples] == [16] * 6 + [100 - 6 * 15 + 1]  # 15 tokens + EOS each
    assert "".join(task.output_features["targets"].vocabulary.decode(ex.tolist()) for ex in examples) == doc


def _bad_jsonl(tmp_path: Path) -> Path:
    """Lines 2, 4, 5, 6 and 8 are bad (line 8 is not UTF-8); line 3 is blank, which is no record."""
    path = _write_jsonl(tmp_path / "mixed.jsonl", [
        json.dumps({"text": "good one"}), "{not json", "", json.dumps({"other": "x"}), json.dumps(["a list"]),
        json.dumps({"text": 7}), json.dumps({"text": "good two"})])
    with path.open("ab") as f:
        f.write(b'{"text": "\xff"}\n')
    return path


def test_bad_jsonl_lines_are_skipped_and_counted(tmp_path, caplog):
    from t5x_lite.data.tasks import text

    path = _bad_jsonl(tmp_path)
    task = text.register_text_task("test_text_skip", {"train": str(path)}, "byte", on_bad_line="skip")
    vocab = task.output_features["targets"].vocabulary
    with caplog.at_level(logging.WARNING):
        assert [vocab.decode(ex.tolist()) for ex in _examples(task)] == ["good one", "good two"]
    assert task.source.bad_records == {str(path): 5}
    assert f"Skipped 1 bad line(s) of {path}" in caplog.text and "line 2: not valid JSON" in caplog.text
    _examples(task)  # a second epoch counts the same lines once
    assert task.source.bad_records == {str(path): 5}


def test_bad_jsonl_line_fails_naming_file_and_line(tmp_path):
    import tensorflow as tf

    from t5x_lite.data.tasks import text

    path = _bad_jsonl(tmp_path)
    task = text.register_text_task("test_text_fail", {"train": str(path)}, "byte")  # 'fail' is the default
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"{path}, line 2: not valid JSON.*on_bad_line='skip'"):
        _examples(task)


@pytest.mark.parametrize("on_bad_line", ["skip", "fail"])
def test_tfrecord_without_the_feature(tmp_path, on_bad_line):
    import tensorflow as tf

    from t5x_lite.data.tasks import text

    path = _write_tfrecord(tmp_path / "r.tfrecord", ["first", None, "third"])
    task = text.register_text_task(f"test_text_tf_{on_bad_line}", {"train": str(path)}, "byte",
                                   on_bad_line=on_bad_line)
    if on_bad_line == "fail":
        with pytest.raises(tf.errors.InvalidArgumentError, match=f"{path}, record 2: 0 values of bytes feature 'text'"):
            _examples(task)
        return
    vocab = task.output_features["targets"].vocabulary
    assert [vocab.decode(ex.tolist()) for ex in _examples(task)] == ["first", "third"]
    assert task.source.bad_records == {str(path): 1}


def test_unreadable_vocabulary_fails_at_registration(tmp_path):
    from t5x_lite.data.tasks import text

    data = str(_write_jsonl(tmp_path / "a.jsonl", [json.dumps({"text": "x"})]))
    (tmp_path / "junk.model").write_bytes(b"not a sentencepiece model")
    for vocab in (tmp_path / "missing.model", tmp_path / "junk.model"):
        with pytest.raises(TaskDataError, match=f"Cannot read the SentencePiece vocabulary '{vocab}'.*'byte'"):
            text.register_text_task("test_text_vocab", {"train": data}, str(vocab))


def test_missing_split_lists_the_splits(tmp_path):
    import seqio

    from t5x_lite.data.tasks import text

    data = str(_write_jsonl(tmp_path / "a.jsonl", [json.dumps({"text": "x"})]))
    task = text.register_text_task("test_text_split", {"train": data}, "byte")
    with pytest.raises(TaskDataError, match=r"no split 'validation'; its splits are \['train'\]"):
        task.get_dataset(sequence_length={"targets": 8}, split="validation", shard_info=seqio.ShardInfo(0, 1))


def test_bad_split_files_fail_at_registration(tmp_path):
    from t5x_lite.data.tasks import text

    good = str(_write_jsonl(tmp_path / "a.jsonl", [json.dumps({"text": "x"})]))
    (tmp_path / "b.jsonl").write_text("")
    with pytest.raises(TaskDataError, match="'validation' matches no files"):
        text.register_text_task("test_text_files", {"train": good, "validation": str(tmp_path / "v*.jsonl")}, "byte")
    with pytest.raises(TaskDataError, match="1 of the 2 files of split 'train' are empty.*b.jsonl"):
        text.register_text_task("test_text_files", {"train": str(tmp_path / "*.jsonl")}, "byte")
    (tmp_path / "c.txt").write_text("x\n")
    with pytest.raises(TaskDataError, match="file_format"):
        text.register_text_task("test_text_files", {"train": str(tmp_path / "c.txt")}, "byte")
    with pytest.raises(TaskDataError, match="on_bad_line"):
        text.register_text_task("test_text_files", {"train": good}, "byte", on_bad_line="ignore")


def test_prefix_lm_examples_split_each_piece_in_order(small_data_dir):
    import seqio

    from t5x_lite.data.tasks import prefix_lm

    task = prefix_lm.register_prefix_lm_task("test_tasks_prefix_lm", str(small_data_dir))
    eos = task.output_features["targets"].vocabulary.eos_id
    dataset = task.get_dataset(sequence_length={"inputs": 32, "targets": 32}, split="train", shuffle=False,
                               num_epochs=1, seed=0)
    examples = list(dataset.as_numpy_iterator())
    documents = [ex["targets"] for ex in task.source.get_dataset(split="train", shuffle=False).as_numpy_iterator()]
    pieces, prefix_lengths = [], set()
    for ex in examples:
        inputs, targets = ex["inputs"].tolist(), ex["targets"].tolist()
        assert inputs[-1] == eos and targets[-1] == eos and len(targets) >= 2
        assert len(inputs) + len(targets) <= 32  # each piece has min(32, 32) - 2 tokens at most
        pieces.append(inputs[:-1] + targets[:-1])
        prefix_lengths.add(len(inputs) - 1)
    assert sum(len(p) == 30 for p in pieces) > 0.9 * len(pieces)
    assert len(prefix_lengths) > 20  # the cut point is random
    # inputs + targets, piece after piece, are the source documents token for token.
    np.testing.assert_array_equal(np.concatenate(pieces), np.concatenate(documents))
    seqio.TaskRegistry.remove("test_tasks_prefix_lm")


@pytest.fixture
def two_tasks(tmp_path):
    """Byte-vocabulary tasks 'test_mix_a' (10 documents 'a0'...) and 'test_mix_b' (100, 'b0'...)."""
    from t5x_lite.data.tasks import text

    for prefix, count in (("a", 10), ("b", 100)):
        _write_jsonl(tmp_path / f"{prefix}.jsonl", [json.dumps({"text": f"{prefix}{i}"}) for i in range(count)])
        text.register_text_task(f"test_mix_{prefix}", {"train": str(tmp_path / f"{prefix}.jsonl")}, "byte")
    return "test_mix_a", "test_mix_b"


def _mixture_texts(name: str, *, num_epochs: int | None, seed: int, take: int = -1) -> list[str]:
    import seqio

    mix = seqio.get_mixture_or_task(name)
    dataset = mix.get_dataset(sequence_length={"targets": 16}, split="train", shuffle=True, seed=seed,
                              num_epochs=num_epochs).take(take)
    vocab = mix.output_features["targets"].vocabulary
    return [vocab.decode(ex["targets"].tolist()) for ex in dataset.as_numpy_iterator()]


def test_mixture_draws_by_rate(two_tasks):
    from t5x_lite.data.tasks import mixtures

    a, b = two_tasks
    assert mixtures.mixture(name="test_mix", tasks=[(a, 1.0), (b, 3.0)]) == "test_mix"
    drawn = _mixture_texts("test_mix", num_epochs=None, seed=1, take=400)
    assert abs(sum(t.startswith("b") for t in drawn) / len(drawn) - 0.75) < 0.06
    assert drawn == _mixture_texts("test_mix", num_epochs=None, seed=1, take=400)  # seeded: deterministic
    # Re-registering replaces the mixture.
    mixtures.mixture(name="test_mix", tasks=[(a, 1.0), (b, 1.0)])
    drawn = _mixture_texts("test_mix", num_epochs=None, seed=1, take=400)
    assert abs(sum(t.startswith("b") for t in drawn) / len(drawn) - 0.5) < 0.06


def test_one_epoch_of_a_mixture(two_tasks):
    from t5x_lite.data.tasks import mixtures

    a, b = two_tasks
    every_a = sorted(f"a{i}" for i in range(10))
    mixtures.mixture(name="test_mix_epoch", tasks=[(a, 1.0), (b, 3.0)])
    for seed in range(3):
        epoch = _mixture_texts("test_mix_epoch", num_epochs=1, seed=seed)
        # It ends at the first draw of the used-up task: all of 'a', some of 'b', each at most once.
        assert sorted(t for t in epoch if t.startswith("a")) == every_a
        seen_b = [t for t in epoch if t.startswith("b")]
        assert 0 < len(seen_b) < 100 and len(set(seen_b)) == len(seen_b)
    mixtures.mixture(name="test_mix_epoch", tasks=[(a, 1.0), (b, 3.0)], exhaust_all_tasks=True)
    epoch = _mixture_texts("test_mix_epoch", num_epochs=1, seed=0)
    assert sorted(epoch) == sorted(every_a + [f"b{i}" for i in range(100)])


def test_mixture_errors(two_tasks):
    from t5x_lite.data.tasks import mixtures

    a, _ = two_tasks
    with pytest.raises(TaskDataError, match="no task or mixture named 'nope'.*test_mix_a"):
        mixtures.mixture(name="test_mix_bad", tasks=[(a, 1.0), ("nope", 1.0)])
    with pytest.raises(TaskDataError, match="rates are positive numbers"):
        mixtures.mixture(name="test_mix_bad", tasks=[(a, 0)])
    with pytest.raises(TaskDataError, match="already a task's name"):
        mixtures.mixture(name=a, tasks=[(a, 1.0)])


def test_gin_binds_text_tasks_into_a_mixture(tmp_path):
    import gin
    import seqio

    for prefix in "ab":
        _write_jsonl(tmp_path / f"{prefix}.jsonl", [json.dumps({"text": prefix})])
    (tmp_path / "mix.gin").write_text("\n".join([
        *(f"{p}/text_task.name = 'test_gin_{p}'\n{p}/text_task.vocabulary = 'byte'\n"
          f"{p}/text_task.splits = {{'train': '{tmp_path / (p + '.jsonl')}'}}" for p in "ab"),
        "mixture.name = 'test_gin_mix'",
        "mixture.tasks = [(@a/text_task(), 1.0), (@b/text_task(), 3.0)]",
    ]))
    try:
        parsing.parse(gin_files=[str(tmp_path / "mix.gin")])
        assert gin.get_configurable("mixture")() == "test_gin_mix"
    finally:
        gin.clear_config()
    mix = seqio.get_mixture_or_task("test_gin_mix")
    assert mix.rate_per_task_name == {"test_gin_a": 1.0, "test_gin_b": 3.0}


def test_prefix_lm_task_trains_the_encoder_decoder(small_data_dir, tmp_path):
    from tests.cli_helpers import VOCAB, losses, run_cli

    result = run_cli("train", "--gin_file=runs/t5_quickstart.gin", "--gin.MIXTURE_OR_TASK_NAME=@prefix_lm_task()",
                     "--gin.prefix_lm_task.name='test_t5_prefix_lm'",
                     f"--gin.prefix_lm_task.data_dir='{small_data_dir}'", f"--gin.MODEL_DIR='{tmp_path / 'run'}'",
                     f"--gin.T5Config.vocab_size={VOCAB}", "--gin.T5Config.emb_dim=64", "--gin.T5Config.mlp_dim=128",
                     "--gin.INPUTS_LENGTH=32", "--gin.SEQUENCE_LENGTH=32", "--gin.BATCH_SIZE=8",
                     "--gin.train.eval_batches=2", "--gin.TRAIN_STEPS=24", "--gin.train.log_period=6",
                     "--gin.WarmupCosine.warmup_steps=6")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "model: encoder_decoder" in result.stdout
    seen = losses(result.stdout)
    assert len(seen) == 4 and seen[-1] < seen[0] - 1.0, (seen, result.stdout)
