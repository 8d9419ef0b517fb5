"""Whole runs through the CLI: exact resume after SIGKILL and SIGTERM at random steps (8
devices), fine-tuning from another run, a NaN stop, and a model directory on s3."""

from __future__ import annotations

import random
import re
import signal
import time

from t5x_lite import storage
from t5x_lite.checkpoints import checkpoint
from tests.cli.test_cli_run import assert_trees_equal, final_params
from tests.cli_helpers import TINY_MODEL, losses, start_cli, train

STEPS = 10
# Dropout on, so that the saved RNG key matters; warmup and decay, so that the schedule does.
COMMON = [f"--gin.TRAIN_STEPS={STEPS}", "--gin.train.checkpoint_period=2", "--gin.train.log_period=1",
          "--gin.WarmupCosine.warmup_steps=3", f"--gin.WarmupCosine.decay_steps={STEPS}",
          "--gin.DecoderConfig.dropout_rate=0.1", "--gin.train.eval_batches=1"]
EXIT_PREEMPTED = 75


def _interrupt(data_dir, model_dir, *, sig, at_step: int, delay: float, devices: int = 8, extra=()):
    """Starts a run and sends it `sig` `delay` seconds after it reports step `at_step`'s loss;
    returns (exit code, output)."""
    args = ["train", "--gin_file=runs/quickstart.gin", f"--gin.DATA_DIR='{data_dir}'",
            f"--gin.MODEL_DIR='{model_dir}'", *TINY_MODEL, *COMMON, *extra]
    process = start_cli(*args, devices=devices)
    lines = []
    for line in process.stdout:
        lines.append(line)
        if line.startswith(f"step {at_step}: loss="):
            time.sleep(delay)
            process.send_signal(sig)
            break
    lines.extend(process.stdout)
    return process.wait(timeout=300), "".join(lines)


EIGHT = ("--gin_file=mesh/fsdp_tensor.gin",)


def test_resume_after_sigkill_and_sigterm_is_bitwise_exact(data_dir, tmp_path):
    """A run on 8 devices (fsdp x tensor) killed with SIGKILL, restarted, stopped with SIGTERM,
    restarted again, ends with the same parameters, bit for bit, as the run never interrupted.
    The kill points are random: any step, during or between (asynchronous) checkpoint writes.
    (Meshes match one device: tests/training/test_trainer.py, test_parallelism.py. Several processes:
    tests/cluster/test_slurm.py.)"""
    rng = random.Random()
    kill_at, kill_delay = rng.randint(3, 5), rng.uniform(0.0, 0.03)
    term_at, term_delay = rng.randint(6, 7), rng.uniform(0.0, 0.03)
    where = f"SIGKILL {kill_delay:.3f}s after step {kill_at}, SIGTERM {term_delay:.3f}s after step {term_at}"

    straight = train(data_dir, tmp_path / "straight", *COMMON, *EIGHT, devices=8)
    assert straight.returncode == 0, straight.stderr[-3000:]
    assert "mesh {'replica': 1, 'data': 1, 'fsdp': 4, 'tensor': 2} on 8 cpu" in straight.stdout
    assert "data: read by index" in straight.stdout  # each restart seeks to its batch (docs/data.md)

    run = tmp_path / "interrupted"
    code, out = _interrupt(data_dir, run, sig=signal.SIGKILL, at_step=kill_at, delay=kill_delay, extra=EIGHT)
    assert code == -signal.SIGKILL, (where, out[-3000:])
    code, out = _interrupt(data_dir, run, sig=signal.SIGTERM, at_step=term_at, delay=term_delay, extra=EIGHT)
    assert code == EXIT_PREEMPTED, (where, out[-3000:])
    assert "received SIGTERM: saved a checkpoint at step" in out
    stopped_at = int(re.search(r"saved a checkpoint at step (\d+)", out).group(1))
    assert term_at <= stopped_at < STEPS, where
    resumed = train(data_dir, run, *COMMON, *EIGHT, devices=8)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"Resuming from the checkpoint at step {stopped_at}" in resumed.stdout, where

    step_a, params_a = final_params(tmp_path / "straight")
    step_b, params_b = final_params(run)
    assert step_a == step_b == STEPS
    assert_trees_equal(params_a, params_b)
    assert losses(straight.stdout)[-1] == losses(resumed.stdout)[-1]


def test_nan_loss_stops_before_a_checkpoint_of_it(data_dir, tmp_path):
    result = train(data_dir, tmp_path / "nan", "--gin.TRAIN_STEPS=12", "--gin.train.checkpoint_period=3",
                   "--gin.train.log_period=100", "--gin.WarmupCosine.peak_learning_rate=1e12",
                   "--gin.WarmupCosine.warmup_steps=0", "--gin.AdamW.clip_grad_norm=None")
    assert result.returncode == 2, result.stdout[-2000:]
    message = re.search(r"error: The loss or gradients became NaN/Inf at step (\d+).*", result.stderr)
    assert message, result.stderr[-2000:]
    bad_step = int(message.group(1))
    saved = sorted(int(p.name) for p in (tmp_path / "nan" / "checkpoints").iterdir()) if (
        tmp_path / "nan" / "checkpoints").exists() else []
    assert all(s < bad_step for s in saved), (saved, bad_step)


def test_model_dir_on_s3(data_dir, s3_server, tmp_path):
    from tests.conftest import S3_BUCKET

    run = f"s3://{S3_BUCKET}/cli-run"
    result = run_cli_env(data_dir, run, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert checkpoint.Checkpointer(run, read_only=True).all_steps() == [4]
    for name in ("config.gin", "vocab/spm.model"):
        assert storage.exists(f"{run}/{name}"), name
    assert storage.glob(f"{run}/tb/train/*")


def run_cli_env(data_dir, run, tmp_path):
    import os

    os.environ["T5X_LITE_STAGING_DIR"] = str(tmp_path / "staging")
    try:
        return train(data_dir, run, "--gin.TRAIN_STEPS=4", "--gin.train.checkpoint_period=2",
                     "--gin.RetentionPolicy.keep_last=1")
    finally:
        del os.environ["T5X_LITE_STAGING_DIR"]
