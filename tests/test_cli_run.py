"""Whole runs through the real CLI in subprocesses, on a tiny corpus prepared by the test."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
VOCAB = 512
TINY_MODEL = [
    f"--gin.DecoderConfig.vocab_size={VOCAB}",
    "--gin.DecoderConfig.emb_dim=64",
    "--gin.DecoderConfig.num_layers=2",
    "--gin.DecoderConfig.mlp_dim=128",
    "--gin.DecoderConfig.head_dim=16",
    "--gin.DecoderConfig.max_len=64",
    "--gin.SEQUENCE_LENGTH=64",
    "--gin.BATCH_SIZE=8",
    "--gin.train.eval_batches=2",
    "--gin.train.sample_prompt=None",
]


def run_cli(*args: str, devices: int = 1, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "2",
           "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"}
    return subprocess.run([sys.executable, "-m", "t5x_lite.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def train(data_dir: Path, model_dir: Path, *extra: str, devices: int = 1) -> subprocess.CompletedProcess:
    return run_cli("train", "--gin_file=runs/quickstart.gin", f"--gin.DATA_DIR='{data_dir}'",
                   f"--gin.MODEL_DIR='{model_dir}'", *TINY_MODEL, *extra, devices=devices)


def losses(stdout: str) -> list[float]:
    return [float(x) for x in re.findall(r"step \d+: loss=([0-9.]+)", stdout)]


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> Path:
    """The stdlib's json and urllib packages, prepared with a tiny vocabulary."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    out = tmp_path_factory.mktemp("data") / "tiny"
    result = run_cli("prepare", f"--input={stdlib / 'json'}",
                     f"--input={stdlib / 'urllib'}", f"--out={out}", f"--vocab_size={VOCAB}",
                     "--num_shards=2", "--validation_fraction=0.2", "--num_workers=2")
    assert result.returncode == 0, result.stderr
    return out


def final_params(model_dir: Path) -> dict:
    from t5x_lite import sample

    _, params, step = sample.load_params(str(model_dir))
    return step, params


def assert_trees_equal(a, b) -> None:
    import jax

    flat_a, tree_a = jax.tree.flatten(a)
    flat_b, tree_b = jax.tree.flatten(b)
    assert tree_a == tree_b
    for x, y in zip(flat_a, flat_b):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_train_loss_falls_and_sample(data_dir, tmp_path):
    result = train(data_dir, tmp_path / "run", "--gin.TRAIN_STEPS=40", "--gin.train.log_period=5",
                   "--gin.train.sample_prompt='def '", "--gin.train.sample_max_new_tokens=8")
    assert result.returncode == 0, result.stderr[-3000:]
    seen = losses(result.stdout)
    assert len(seen) == 8
    assert seen[-1] < seen[0] - 0.5, seen
    assert "validation loss" in result.stdout and "perplexity" in result.stdout
    assert "initial loss" in result.stdout
    assert (tmp_path / "run" / "config.gin").read_text().count("DecoderConfig.emb_dim = 64") == 1
    assert (tmp_path / "run" / "checkpoints" / "40").is_dir()
    assert "sample:\ndef " in result.stdout

    sampled = run_cli("sample", f"--model_dir={tmp_path / 'run'}", "--prompt=import ", "--max_new_tokens=8")
    assert sampled.returncode == 0, sampled.stderr[-3000:]
    assert sampled.stdout.startswith("[step 40]\nimport ")


def test_resume_is_exact(data_dir, tmp_path):
    """Train 2k steps straight vs. k steps, stop, resume for k more: identical parameters."""
    common = ["--gin.OptimizerConfig.decay_steps=12", "--gin.OptimizerConfig.warmup_steps=4",
              "--gin.train.checkpoint_period=100", "--gin.DecoderConfig.dropout_rate=0.1"]
    straight = train(data_dir, tmp_path / "straight", "--gin.TRAIN_STEPS=16", *common)
    assert straight.returncode == 0, straight.stderr[-3000:]
    first = train(data_dir, tmp_path / "resumed", "--gin.TRAIN_STEPS=8", *common)
    assert first.returncode == 0, first.stderr[-3000:]
    second = train(data_dir, tmp_path / "resumed", "--gin.TRAIN_STEPS=16", *common)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "Resuming from the checkpoint at step 8" in second.stdout

    step_a, params_a = final_params(tmp_path / "straight")
    step_b, params_b = final_params(tmp_path / "resumed")
    assert step_a == step_b == 16
    assert_trees_equal(params_a, params_b)
    # The last logged losses agree too (same data, same order).
    assert losses(straight.stdout)[-1] == losses(second.stdout)[-1]


def test_eight_devices_match_one(data_dir, tmp_path):
    one = train(data_dir, tmp_path / "one", "--gin.TRAIN_STEPS=6", "--gin.train.log_period=1")
    eight = train(data_dir, tmp_path / "eight", "--gin.TRAIN_STEPS=6", "--gin.train.log_period=1",
                  "--gin_file=mesh/data_model.gin", devices=8)
    assert one.returncode == 0, one.stderr[-3000:]
    assert eight.returncode == 0, eight.stderr[-3000:]
    assert "mesh {'data': 4, 'model': 2} on 8 cpu" in eight.stdout
    np.testing.assert_allclose(losses(eight.stdout), losses(one.stdout), rtol=2e-4)
