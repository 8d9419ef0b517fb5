"""Runs that have nothing to do, or stop before their first checkpoint, against a trained model
directory: one line, the right exit code, and a config.gin that still describes the checkpoints
beside it. Configs written for an older t5x_lite (renamed configurables) or saved with a
byte-order mark, through the CLI."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.cli.test_bad_input import assert_bad_input, assert_untouched, copy_of_trained_run, tree_digest
from tests.cli_helpers import run_cli_in_process, train_in_process


def checkpoint_files(model_dir: Path) -> dict[str, str]:
    return {name: digest for name, digest in tree_digest(model_dir).items() if name.startswith("checkpoints/")}


def test_a_limit_before_the_latest_checkpoint_is_refused_and_changes_nothing(data_dir, trained_run, tmp_path):
    """The trained run's latest checkpoint is step 40: TRAIN_STEPS=20 could train nothing."""
    model_dir, digest, config_mtime = copy_of_trained_run(trained_run, tmp_path)
    result = train_in_process(data_dir, model_dir, "--gin.TRAIN_STEPS=20", "--gin.train.eval_batches=1")
    assert_bad_input(result, f"error: Nothing to train: the latest checkpoint in {model_dir} is step 40 and "
                             "TRAIN_STEPS is 20; raise TRAIN_STEPS (or NUM_EPOCHS) to train further. "
                             "Nothing was changed.")
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert_untouched(model_dir, digest, config_mtime)


def test_a_damaged_step_past_the_limit_does_not_refuse_the_run(data_dir, trained_run, tmp_path):
    """Step 50 is damaged (a copy of step 40 with a flipped byte): TRAIN_STEPS=45 resumes from step 40,
    which is before the limit, and trains."""
    model_dir, _, _ = copy_of_trained_run(trained_run, tmp_path)
    shutil.copytree(model_dir / "checkpoints" / "40", model_dir / "checkpoints" / "50")
    largest = max((p for p in (model_dir / "checkpoints" / "50").rglob("*") if p.is_file()),
                  key=lambda p: p.stat().st_size)
    data = bytearray(largest.read_bytes())
    data[len(data) // 2] ^= 0xFF
    largest.write_bytes(bytes(data))
    result = train_in_process(data_dir, model_dir, "--gin.TRAIN_STEPS=45", "--gin.train.eval_batches=1")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Resuming from the checkpoint at step 40" in result.stdout
    assert (model_dir / "checkpoints" / "45").is_dir()


def test_a_run_already_at_its_limit_is_done_and_keeps_config_gin(data_dir, trained_run, tmp_path):
    """TRAIN_STEPS=40 on a directory at step 40: a finished run (exit 0, evaluated again); it writes no
    checkpoint, so config.gin keeps describing the run that wrote them, not this run's settings."""
    model_dir, _, _ = copy_of_trained_run(trained_run, tmp_path)
    config_before, checkpoints_before = (model_dir / "config.gin").read_bytes(), checkpoint_files(model_dir)
    result = train_in_process(data_dir, model_dir, "--gin.TRAIN_STEPS=40", "--gin.train.eval_batches=1")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Resuming from the checkpoint at step 40" in result.stdout
    assert "Nothing to train: step 40 is TRAIN_STEPS already" in result.stdout
    assert "step 40: validation loss" in result.stdout
    assert (model_dir / "config.gin").read_bytes() == config_before
    assert checkpoint_files(model_dir) == checkpoints_before


def test_a_resumed_run_stopped_by_nan_keeps_config_gin(data_dir, trained_run, tmp_path):
    """A resumed run with a learning rate that diverges stops before its first checkpoint: config.gin
    is the one of the run that wrote the checkpoints, not the stopped run's."""
    model_dir, _, _ = copy_of_trained_run(trained_run, tmp_path)
    config_before, checkpoints_before = (model_dir / "config.gin").read_bytes(), checkpoint_files(model_dir)
    result = train_in_process(data_dir, model_dir, "--gin.TRAIN_STEPS=60", "--gin.train.checkpoint_period=5",
                              "--gin.WarmupCosine.peak_learning_rate=1e30", "--gin.WarmupCosine.warmup_steps=0")
    assert_bad_input(result, "error: The loss or gradients became NaN/Inf at step",
                     "the last checkpoint (step 40) is untouched")
    assert (model_dir / "config.gin").read_bytes() == config_before
    assert checkpoint_files(model_dir) == checkpoints_before


def test_a_config_binding_a_renamed_configurable_names_its_successor(data_dir, tmp_path):
    old = tmp_path / "old.gin"
    old.write_text("include 'runs/quickstart.gin'\nOptimizerConfig.peak_learning_rate = 1e-3\n")
    result = train_in_process(data_dir, tmp_path / "run", f"--gin_file={old}")
    assert_bad_input(result, f"error: OptimizerConfig.peak_learning_rate (in {old}, line 2) is now "
                             "WarmupCosine.peak_learning_rate: OptimizerConfig was replaced by train.optimizer = "
                             "@AdamW() with AdamW.learning_rate = @WarmupCosine() (docs/optimizers.md).")
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (tmp_path / "run").exists()


def test_a_gin_file_with_a_byte_order_mark_is_read(tmp_path):
    """As some editors save UTF-8: the mark is skipped, in a --gin_file and in a file it includes."""
    inner = tmp_path / "inner.gin"
    inner.write_bytes("\ufeffTRAIN_STEPS = 7\n".encode())
    outer = tmp_path / "outer.gin"
    outer.write_bytes(f"\ufeffinclude 'runs/quickstart.gin'\ninclude '{inner}'\n".encode())
    result = run_cli_in_process("config", "explain", f"--gin_file={outer}", "TRAIN_STEPS")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "7" in result.stdout and "inner.gin:1" in result.stdout, result.stdout
