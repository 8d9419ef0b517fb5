"""Whole runs that must not damage a model directory: a second trainer on it, a disk that fills
during a save, and a reader opened while the trainer saves."""

from __future__ import annotations

import re

import pytest

from t5x_lite.checkpoints import verify
from tests.checkpoints.test_verified_checkpoints import tree_digest
from tests.cli_helpers import TINY_MODEL, run_cli_in_process, start_cli, train


def _train_args(data_dir, model_dir, *extra):
    return ["train", "--gin_file=runs/quickstart.gin", f"--gin.DATA_DIR='{data_dir}'",
            f"--gin.MODEL_DIR='{model_dir}'", *TINY_MODEL, *extra]


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def test_a_second_trainer_on_a_running_model_dir_stops_and_changes_nothing(data_dir, tmp_path):
    model_dir = tmp_path / "run"
    first = start_cli(*_train_args(data_dir, model_dir, "--gin.TRAIN_STEPS=100000", "--gin.train.log_period=1",
                                   "--gin.train.checkpoint_period=100000"))
    lines = []
    try:
        for line in first.stdout:
            lines.append(line)
            if line.startswith("step 2: loss="):
                break
        assert (model_dir / "lease.json").exists(), "".join(lines)
        before = {k: v for k, v in tree_digest(model_dir).items() if k.startswith("config")}
        # Refused before it writes anything: run through the CLI's main in this process.
        second = run_cli_in_process(*_train_args(data_dir, model_dir, "--gin.TRAIN_STEPS=5",
                                                 "--gin.WarmupCosine.peak_learning_rate=0.5"))
        assert second.returncode == 2, second.stdout + second.stderr
        errors = _error_lines(second.stderr)
        assert len(errors) == 1 and "in use by another run" in errors[0] and f"pid {first.pid}" in errors[0]
        assert "checkpoint unlock" in errors[0] and "Traceback" not in second.stderr
        assert {k: v for k, v in tree_digest(model_dir).items() if k.startswith("config")} == before
    finally:
        first.terminate()
        rest = first.communicate(timeout=300)[0]
    assert first.returncode == 75, "".join(lines) + rest  # SIGTERM: saved and stopped, resumable
    assert not (model_dir / "lease.json").exists()  # released on the way out
    # The first run's checkpoint survives, and the run resumes from it.
    saved = int(re.findall(r"step (\d+): checkpoint saved", rest)[-1])
    resumed = train(data_dir, model_dir, f"--gin.TRAIN_STEPS={saved + 2}", "--gin.train.log_period=1")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"Resuming from the checkpoint at step {saved}" in resumed.stdout


@pytest.fixture
def small_disk(small_tmpfs):
    """Room for one checkpoint of the tiny model (about 1.6 MB) and the run's other files, not two."""
    return small_tmpfs("2560k")


def test_a_full_disk_stops_the_run_with_one_line_and_keeps_the_last_good_step(data_dir, small_disk):
    model_dir = small_disk / "run"
    result = train(data_dir, model_dir, "--gin.TRAIN_STEPS=4", "--gin.train.checkpoint_period=2",
                   "--gin.RetentionPolicy.keep_last=1", "--gin.train.log_period=1")
    assert result.returncode == 2, result.stdout + result.stderr
    errors = _error_lines(result.stderr)
    assert len(errors) == 1, result.stderr
    assert "No space left on device" in errors[0] and "step 2 is the last good checkpoint" in errors[0]
    assert "Traceback" not in result.stderr and len(result.stderr.splitlines()) < 15, result.stderr
    assert "step 2: checkpoint saved" in result.stdout and "step 4: checkpoint saved" not in result.stdout
    states = {s.step: s.state for s in verify.directory_states(str(model_dir))}
    assert states == {2: "good"}  # the failed save's partial files are gone, step 2 is whole
    assert not (model_dir / "lease.json").exists()
