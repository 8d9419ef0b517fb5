"""T5 (encoder-decoder) pre-training on span corruption: the task's examples and whole CLI runs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.cli.test_bad_input import assert_bad_input
from tests.cli_helpers import VOCAB, losses, run_cli, run_cli_in_process

EXTRA_IDS = 100  # tasks.span_corruption.EXTRA_IDS
MODEL_VOCAB = 640  # 512 pieces + 100 sentinels, padded to a multiple of 128
INPUTS_LENGTH, TARGETS_LENGTH = 64, 16
T5_TINY = [
    f"--gin.T5Config.vocab_size={MODEL_VOCAB}",
    "--gin.T5Config.emb_dim=64",
    "--gin.T5Config.mlp_dim=128",
    f"--gin.INPUTS_LENGTH={INPUTS_LENGTH}",
    f"--gin.SEQUENCE_LENGTH={TARGETS_LENGTH}",
    "--gin.BATCH_SIZE=8",
    "--gin.train.eval_batches=2",
]


def train_t5(data_dir: Path, model_dir: Path, *extra: str):
    """The T5 quickstart run with a tiny T5 on `data_dir`, plus `extra` flags."""
    return run_cli("train", "--gin_file=runs/t5_quickstart.gin", f"--gin.DATA_DIR='{data_dir}'",
                   f"--gin.MODEL_DIR='{model_dir}'", *T5_TINY, *extra)


def train_t5_in_process(data_dir: Path, model_dir: Path, *extra: str):
    """The same flags through the CLI's main in this process: for runs refused before any work."""
    return run_cli_in_process("train", "--gin_file=runs/t5_quickstart.gin", f"--gin.DATA_DIR='{data_dir}'",
                              f"--gin.MODEL_DIR='{model_dir}'", *T5_TINY, *extra)


def checkpoint_steps(model_dir: Path) -> list[int]:
    root = model_dir / "checkpoints"
    return sorted(int(p.name) for p in root.iterdir() if p.name.isdigit()) if root.is_dir() else []


def checkpoint_json(model_dir: Path, step: int, item: str) -> dict:
    return json.loads((model_dir / "checkpoints" / str(step) / item / "metadata").read_text())


def test_t5_span_corruption_trains(small_data_dir, tmp_path):
    """A tiny T5 learns span corruption through the CLI and saves its checkpoint. (Resuming is
    family-independent code, tested on decoders in test_checkpoint_runs.py and test_slurm.py.)"""
    model_dir = tmp_path / "t5"
    first = train_t5(small_data_dir, model_dir, "--gin.TRAIN_STEPS=40", "--gin.train.log_period=5")
    assert first.returncode == 0, first.stderr[-3000:]
    assert "model: encoder_decoder, " in first.stdout
    assert "initial loss" in first.stdout and "WARNING" not in first.stdout, first.stdout
    seen = losses(first.stdout)
    assert len(seen) == 8, first.stdout
    assert seen[-1] < seen[0] - 1.0, seen
    assert abs(seen[0] - np.log(MODEL_VOCAB)) < 0.5, seen  # untrained: about ln(vocab)
    assert "step 40: validation loss" in first.stdout
    assert checkpoint_steps(model_dir) == [40]
    metadata = checkpoint_json(model_dir, 40, "metadata")
    assert metadata["family"] == "encoder_decoder"
    assert metadata["vocab_size"] == VOCAB + EXTRA_IDS  # pieces + sentinels
    assert metadata["model"]["emb_dim"] == 64 and metadata["step"] == 40
    position = checkpoint_json(model_dir, 40, "data_iterator")  # 40 batches taken, in one epoch or more
    assert (position["epoch"], position["batches_in_epoch"]) == (0, 40) or (
        position["epoch"] >= 1 and 0 <= position["batches_in_epoch"] < 40), position
    assert (model_dir / "vocab" / "spm.model").is_file()
    assert "T5Config.emb_dim = 64" in (model_dir / "config.gin").read_text()


@pytest.fixture(scope="module")
def span_corruption_examples(small_data_dir):
    """(task, noised examples, source documents) of the train split, in file order."""
    import seqio

    from t5x_lite.data.tasks import span_corruption

    name = "test_t5_run_span_corruption"
    span_corruption.register_span_corruption_task(name, str(small_data_dir))
    task = seqio.get_mixture_or_task(name)
    dataset = task.get_dataset(sequence_length={"inputs": INPUTS_LENGTH, "targets": TARGETS_LENGTH},
                               split="train", shuffle=False, num_epochs=1, seed=0)
    examples = [{k: np.asarray(v) for k, v in ex.items()} for ex in dataset.as_numpy_iterator()]
    documents = [np.asarray(ex["targets"]) for ex in
                 task.source.get_dataset(split="train", shuffle=False).as_numpy_iterator()]
    yield task, examples, documents
    seqio.TaskRegistry.remove(name)


def _split_at_sentinels(tokens: np.ndarray) -> tuple[list[int], list[list[int]]]:
    """(sentinel ids in order, the runs of ordinary tokens after each sentinel)."""
    sentinels, runs = [], []
    for t in tokens.tolist():
        if t >= VOCAB:
            sentinels.append(t)
            runs.append([])
        else:
            runs[-1].append(t)
    return sentinels, runs


def test_span_corruption_examples(span_corruption_examples):
    from t5x_lite.data.tasks.span_corruption import span_corruption_lengths

    task, examples, documents = span_corruption_examples
    vocabulary = task.output_features["targets"].vocabulary
    assert vocabulary.vocab_size == VOCAB + EXTRA_IDS
    eos = vocabulary.eos_id
    raw_length, expected_targets = span_corruption_lengths(INPUTS_LENGTH)
    assert expected_targets <= TARGETS_LENGTH  # what makes SEQUENCE_LENGTH=16 enough for INPUTS_LENGTH=64
    assert len(examples) > 100

    reconstructed = []
    for i, ex in enumerate(examples):
        inputs, targets = ex["inputs"], ex["targets"]
        assert inputs[-1] == eos and targets[-1] == eos
        assert eos not in inputs[:-1].tolist() and eos not in targets[:-1].tolist()
        inputs, targets = inputs[:-1], targets[:-1]
        assert targets[0] >= VOCAB, targets  # targets start with a sentinel
        in_sentinels = [int(t) for t in inputs if t >= VOCAB]
        target_sentinels, spans = _split_at_sentinels(targets)
        # The k-th sentinel of the inputs is the k-th of the targets: the top ids, counting down.
        assert in_sentinels == target_sentinels, (in_sentinels, target_sentinels)
        assert in_sentinels == list(range(VOCAB + EXTRA_IDS - 1, VOCAB + EXTRA_IDS - 1 - len(in_sentinels), -1))
        assert all(spans), spans  # every sentinel stands for at least one dropped token
        original = []
        for t in inputs.tolist():
            original.extend(spans.pop(0) if t >= VOCAB else [t])
        assert len(inputs) <= len(original) < len(inputs) + len(targets)  # a one-token span keeps the length
        reconstructed.append(original)
        if i < len(examples) - 1:
            # Every full-length example fills the encoder row exactly and its targets fit.
            assert len(original) == raw_length
            assert len(ex["inputs"]) == INPUTS_LENGTH
            assert len(ex["targets"]) == expected_targets
            noise = len(original) - (len(inputs) - len(in_sentinels))
            assert abs(noise / len(original) - 0.15) < 0.02

    # Putting the dropped spans back gives the concatenated source documents, token for token.
    source = np.concatenate(documents).astype(np.int64)
    np.testing.assert_array_equal(np.concatenate([np.asarray(r, np.int64) for r in reconstructed]), source)


def test_t5_with_the_lm_feature_converter(small_data_dir, tmp_path):
    result = train_t5_in_process(small_data_dir, tmp_path / "run", "--gin.TRAIN_STEPS=2",
                                 "--gin.train/DataConfig.feature_converter='lm'")
    assert_bad_input(result, "feature_converter", "'enc_dec'")
    assert checkpoint_steps(tmp_path / "run") == []
    assert not (tmp_path / "run").exists()


def test_t5_without_inputs_length(small_data_dir, tmp_path):
    result = train_t5_in_process(small_data_dir, tmp_path / "run", "--gin.TRAIN_STEPS=2", "--gin.INPUTS_LENGTH=None")
    assert_bad_input(result, "INPUTS_LENGTH")
    assert not (tmp_path / "run").exists()


def test_t5_vocabulary_too_small(small_data_dir, tmp_path):
    result = train_t5_in_process(small_data_dir, tmp_path / "run", "--gin.TRAIN_STEPS=2",
                                 f"--gin.T5Config.vocab_size={VOCAB}")
    assert_bad_input(result, f"T5Config.vocab_size={VOCAB}", f"vocabulary has {VOCAB + EXTRA_IDS} entries",
                     f"--gin.T5Config.vocab_size={VOCAB + EXTRA_IDS}")
    assert not (tmp_path / "run").exists()
