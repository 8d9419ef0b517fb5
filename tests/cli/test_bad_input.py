"""Bad input: one clear message naming the problem and the fix, exit 2, nothing touched."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from tests.cli_helpers import run_cli, train


def assert_bad_input(result, *phrases: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stderr[-3000:])
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    error_lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(error_lines) == 1, result.stderr[-3000:]
    for phrase in phrases:
        assert phrase in result.stderr, (phrase, result.stderr[-3000:])


def tree_digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_missing_data_dir(tmp_path):
    result = train(tmp_path / "nowhere", tmp_path / "run", "--gin.TRAIN_STEPS=2")
    assert_bad_input(result, "has no metadata.json", "t5x-lite prepare")
    assert not (tmp_path / "run").exists()


def test_empty_data_dir(tmp_path):
    (tmp_path / "empty").mkdir()
    result = train(tmp_path / "empty", tmp_path / "run", "--gin.TRAIN_STEPS=2")
    assert_bad_input(result, "has no metadata.json", "t5x-lite prepare")


def test_vocabulary_size_disagrees_with_model(data_dir, tmp_path):
    result = train(data_dir, tmp_path / "run", "--gin.TRAIN_STEPS=2", "--gin.DecoderConfig.vocab_size=300")
    assert_bad_input(result, "vocabulary has 512 entries", "--gin.DecoderConfig.vocab_size=512")
    assert not (tmp_path / "run").exists()


def test_unknown_gin_binding_suggests_the_name(data_dir, tmp_path):
    result = train(data_dir, tmp_path / "run", "--gin.DecoderConfig.num_layer=2")
    assert_bad_input(result, "num_layer", "Did you mean num_layers")


def test_unknown_configurable_suggests_the_name(data_dir, tmp_path):
    result = train(data_dir, tmp_path / "run", "--gin.DecoderConfg.num_layers=2")
    assert_bad_input(result, "DecoderConfg", "Did you mean DecoderConfig")


def test_gin_syntax_error_names_file_and_line(data_dir, tmp_path):
    bad = tmp_path / "bad.gin"
    bad.write_text("TRAIN_STEPS = 3\nDecoderConfig.num_layers = = 2\n")
    result = train(data_dir, tmp_path / "run", f"--gin_file={bad}")
    assert_bad_input(result, "bad.gin, line 2")


def test_sequence_length_that_does_not_fit(data_dir, tmp_path):
    result = train(data_dir, tmp_path / "run", "--gin.TRAIN_STEPS=2", "--gin.SEQUENCE_LENGTH=128")
    assert_bad_input(result, "sequence_length=128", "max_len=64")


def test_model_dir_with_a_different_model_is_left_untouched(data_dir, trained_run, tmp_path):
    model_dir = tmp_path / "run"
    shutil.copytree(trained_run[0], model_dir)
    before = tree_digest(model_dir)
    result = train(data_dir, model_dir, "--gin.TRAIN_STEPS=12", "--gin.DecoderConfig.emb_dim=32")
    assert_bad_input(result, "holds checkpoints of a different model", "emb_dim: checkpoint 64 vs config 32",
                     "new --gin.MODEL_DIR")
    assert tree_digest(model_dir) == before
    # The same model with another optimizer state (no clipping): refused when the state is read,
    # and the directory's config.gin still describes the run whose checkpoints it holds.
    result = train(data_dir, model_dir, "--gin.TRAIN_STEPS=12", "--gin.OptimizerConfig.clip_grad_norm=None")
    assert_bad_input(result, "Nothing was changed")
    assert tree_digest(model_dir) == before


def test_missing_steps_and_epochs(data_dir, tmp_path):
    result = train(data_dir, tmp_path / "run", "--gin.TRAIN_STEPS=None")
    assert_bad_input(result, "TRAIN_STEPS", "num_epochs")


def test_unknown_cli_command():
    result = run_cli("trian")
    assert result.returncode == 2
    assert "unknown command 'trian'" in result.stderr


def test_missing_split_lists_the_splits(data_dir, tmp_path):
    result = train(data_dir, tmp_path / "run", "--gin.TRAIN_STEPS=2", "--gin.eval/DataConfig.split='test'")
    assert_bad_input(result, "no split 'test'", "['train', 'validation']", "eval/DataConfig.split")
    assert not (tmp_path / "run").exists()


def test_bad_period_names_the_flag(data_dir, tmp_path):
    result = train(data_dir, tmp_path / "run", "--gin.TRAIN_STEPS=2", "--gin.train.eval_period='each epoch'")
    assert_bad_input(result, "train.eval_period='each epoch'", "'1 epoch'")
    assert not (tmp_path / "run").exists()


def test_malformed_jsonl_line_names_file_and_line(data_dir, tmp_path):
    """A text task in 'fail' mode: the bad line stops the run with one message, exit 2."""
    import json

    lines = [json.dumps({"text": f"def f{i}(x):\n    return x + {i}\n" * 20}) for i in range(40)]
    lines[2] = '{"text": "no closing quote}'
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("\n".join(lines) + "\n")
    result = train(data_dir, tmp_path / "run", "--gin.TRAIN_STEPS=2",
                   "--gin.MIXTURE_OR_TASK_NAME=@text_task()", "--gin.text_task.name='bad_jsonl'",
                   f"--gin.text_task.splits={{'train': '{corpus}', 'validation': '{corpus}'}}",
                   f"--gin.text_task.vocabulary='{data_dir}/spm.model'")
    assert_bad_input(result, f"{corpus}, line 3", "on_bad_line='skip'")
