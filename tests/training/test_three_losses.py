"""Training loss, in-training validation loss and `t5x-lite eval`'s perplexity measure the same thing:
on a corpus whose tokens are drawn independently (so context cannot help) all three agree with
each other and with the corpus's entropy, because validation lays out rows as training does."""

from __future__ import annotations

import json
import math
import re
import shutil

import numpy as np

from t5x_lite.data.preparation import index_command
from t5x_lite.data.records import example_codec, record_frame
from tests.cli_helpers import run_cli_in_process, train_in_process

EOS = 1
TOKENS = np.arange(10, 18)
PROBS = np.array([0.4, 0.2, 0.1, 0.1, 0.05, 0.05, 0.05, 0.05])
STOP = 1 / 40  # after each token the document ends with this probability: EOS is memoryless too


def write_split(out, split: str, documents: list[np.ndarray], num_shards: int = 2) -> dict:
    for s in range(num_shards):
        with open(out / f"{split}-{s:05d}-of-{num_shards:05d}.tfrecord", "wb") as f:
            for i in range(s, len(documents), num_shards):
                record_frame.write_frame(f, example_codec.encode_example({"targets": documents[i], "id": [i]}))
    return {"pattern": f"{split}-*-of-*.tfrecord", "num_shards": num_shards, "num_examples": len(documents),
            "num_tokens": int(sum(map(len, documents)))}


def corpus_entropy() -> float:
    """Nats per predicted token of the process: each of a document's tokens and its EOS."""
    outcomes = np.concatenate([(1 - STOP) * PROBS, [STOP]])
    return float(-(outcomes * np.log(outcomes)).sum())


def test_training_validation_and_eval_losses_agree_at_the_entropy(small_data_dir, tmp_path):
    rng = np.random.default_rng(0)
    data = tmp_path / "iid"
    data.mkdir()
    shutil.copy(small_data_dir / "spm.model", data / "spm.model")

    def documents(n: int) -> list[np.ndarray]:
        return [rng.choice(TOKENS, size=rng.geometric(STOP), p=PROBS) for _ in range(n)]

    splits = {"train": write_split(data, "train", documents(400)),
              "validation": write_split(data, "validation", documents(120))}
    (data / "metadata.json").write_text(json.dumps({"format_version": 1, "vocab_size": 512,
                                                    "vocabulary": "spm.model", "splits": splits}))
    index_command.index_directory(str(data), log=lambda _: None)

    model_dir = tmp_path / "run"
    result = train_in_process(data, model_dir, "--gin.TRAIN_STEPS=160", "--gin.train.log_period=40",
                              "--gin.train.eval_period=160", "--gin.train.eval_batches=None",
                              "--gin.train.checkpoint_period=160")
    assert result.returncode == 0, result.stderr[-3000:]
    train_loss = [float(x) for x in re.findall(r"step \d+: loss=([0-9.]+)", result.stdout)][-1]
    validation_loss = float(re.search(r"step 160: validation loss ([0-9.]+)", result.stdout).group(1))
    evaluated = run_cli_in_process("eval", "--gin_file=runs/quickstart_eval.gin", f"--gin.DATA_DIR='{data}'",
                                   f"--gin.MODEL_DIR='{model_dir}'", "--gin.PerplexityEval.context_length=64",
                                   "--gin.PerplexityEval.stride=32")
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    eval_loss = float(re.search(r"validation perplexity [0-9.]+ \(loss ([0-9.]+)", evaluated.stdout).group(1))

    floor = corpus_entropy()
    # The same validation tokens, laid out in rows or scored document by document: within 0.5%.
    assert math.isclose(validation_loss, eval_loss, rel_tol=0.005), (validation_loss, eval_loss)
    # The training split's own sample, and the last 40 steps' average: within 2%.
    assert math.isclose(train_loss, eval_loss, rel_tol=0.02), (train_loss, eval_loss)
    # Learned down to the corpus's entropy (a finite sample: a little above or below it).
    for loss in (train_loss, validation_loss, eval_loss):
        assert math.isclose(loss, floor, rel_tol=0.02), (loss, floor)
