"""`t5x-lite launch slurm` against a real SLURM: a local cluster (slurmctld, slurmd, munged)
runs 2-task jobs, each a data-parallel run of 2 JAX processes joined over gloo.

Skipped where the cluster cannot start (not root, slurm-wlm/munge missing) unless
T5X_LITE_REQUIRE_SLURM=1 (set by .ci/run), which makes that a failure.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from t5x_lite.checkpoints import checkpoint
from t5x_lite.checkpoints.retention import RetentionPolicy
from tests.cli.test_cli_run import assert_trees_equal, final_params
from tests.cli_helpers import ROOT, TINY_MODEL, cli_env, losses
from tests.slurm_cluster import LocalSlurmCluster, unavailable_reason

pytestmark = pytest.mark.slurm

STEPS = 48  # room for the preemption sync point (it can take several steps under load) before the last step
RUN = ["--gin_file=runs/quickstart.gin", *TINY_MODEL, f"--gin.TRAIN_STEPS={STEPS}", "--gin.train.log_period=1",
       "--gin.train.checkpoint_period=4", "--gin.WarmupCosine.warmup_steps=2",
       "--gin.DecoderConfig.dropout_rate=0.1", "--gin.train.eval_data=None"]
EXIT_PREEMPTED = 75


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    reason = unavailable_reason()
    if reason:
        if os.environ.get("T5X_LITE_REQUIRE_SLURM") == "1":
            pytest.fail(f"T5X_LITE_REQUIRE_SLURM=1 but {reason}")
        pytest.skip(reason)
    with LocalSlurmCluster(tmp_path_factory.mktemp("slurm")) as local:
        yield local


def launch(cluster: LocalSlurmCluster, data_dir: Path, model_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    """`t5x-lite launch slurm` of the tiny run as 2 processes on the local node (1 CPU device each)."""
    env = {**cli_env(devices=1), "SLURM_CONF": cluster.env["SLURM_CONF"]}
    return subprocess.run(
        [sys.executable, "-m", "t5x_lite.cli", "launch", "slurm", *RUN, f"--gin.DATA_DIR='{data_dir}'",
         f"--gin.MODEL_DIR='{model_dir}'", "--nodes=1", "--tasks_per_node=2", "--time=00:10:00",
         f"--output={model_dir.parent / (model_dir.name + '-%j.out')}", *extra],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def submitted_job(result: subprocess.CompletedProcess) -> int:
    assert result.returncode == 0, result.stderr[-3000:]
    return int(re.search(r"submitted job (\d+)", result.stdout).group(1))


def job_output(model_dir: Path, job: int) -> str:
    return (model_dir.parent / f"{model_dir.name}-{job}.out").read_text()


def _params_at(model_dir: Path, step: int, scratch: Path):
    """The parameters of `model_dir`'s checkpoint at `step` (a copy without the later steps, restored)."""
    copy = scratch / f"{model_dir.name}_at_{step}"
    shutil.copytree(model_dir, copy)
    _drop_checkpoints_after(copy, step)
    found, params = final_params(copy)
    assert found == step
    return params


def _saved_steps(model_dir: Path) -> list[int]:
    # keep_every=1: closing a Checkpointer applies its retention, and this one must delete nothing.
    checkpoints = checkpoint.Checkpointer(str(model_dir), read_only=True, retention=RetentionPolicy(keep_every=1))
    try:
        return checkpoints.all_steps()
    finally:
        checkpoints.close()


def _drop_checkpoints_after(model_dir: Path, step: int) -> None:
    for saved in _saved_steps(model_dir):
        if saved > step:
            shutil.rmtree(Path(checkpoint.checkpoints_dir(str(model_dir))) / str(saved))


def test_two_process_job_is_stopped_by_scancel_and_resumes_exactly(cluster, small_data_dir, tmp_path):
    """A 2-process job stopped by `scancel --signal=TERM` saves and exits 75. Submitted again after
    all but its earliest checkpoint are removed, it resumes there, replays the steps up to the
    stop with the same losses, and writes the next periodic checkpoint bit for bit as the first
    job did. Both processes joined, only process 0 logged, and the loss fell."""
    run = tmp_path / "run"
    job = submitted_job(launch(cluster, small_data_dir, run))
    output = run.parent / f"{run.name}-{job}.out"
    deadline = time.monotonic() + 240
    while not (output.exists() and "step 9: loss=" in output.read_text()):
        assert time.monotonic() < deadline, output.read_text() if output.exists() else "no output"
        time.sleep(0.2)
    cluster.run("scancel", "--signal=TERM", str(job))
    result = cluster.wait(job, timeout=240)
    out = job_output(run, job)
    assert (result.state, result.exit_code) == ("FAILED", EXIT_PREEMPTED), out[-3000:]
    assert "on 2 cpu device(s) in 2 processes" in out and "2 data shard(s) of 4 rows" in out, out[-3000:]
    assert "data: read by index" in out, out[-3000:]  # each process its slice of every global batch
    stopped_at = int(re.search(r"saved a checkpoint at step (\d+) and stopped", out).group(1))
    assert 9 <= stopped_at < STEPS, out[-3000:]
    first_losses = losses(out)
    assert len(first_losses) == stopped_at and out.count("step 9: loss=") == 1, "only process 0 writes the log"
    # Periodic checkpoints every 4 steps, the last 3 kept: the earliest kept one is the resume
    # point, and the next (periodic, so the second job writes it again) is compared.
    kept = _saved_steps(run)
    resume_at, compare_at = kept[0], kept[1]
    assert compare_at % 4 == 0 and compare_at < stopped_at == kept[-1], kept
    first_params = _params_at(run, compare_at, tmp_path)

    _drop_checkpoints_after(run, resume_at)
    # This job keeps every checkpoint, so that the one compared survives its later saves.
    job = submitted_job(launch(cluster, small_data_dir, run, "--gin.RetentionPolicy.keep_last=100"))
    result = cluster.wait(job, timeout=300)
    out = job_output(run, job)
    assert (result.state, result.exit_code) == ("COMPLETED", 0), out[-3000:]
    assert f"Resuming from the checkpoint at step {resume_at}" in out, out[-3000:]
    resumed_losses = losses(out)
    assert len(resumed_losses) == STEPS - resume_at
    assert resumed_losses[:stopped_at - resume_at] == first_losses[resume_at:], (first_losses, resumed_losses)
    assert resumed_losses[-1] < first_losses[0] - 0.05, (first_losses, resumed_losses)
    assert_trees_equal(_params_at(run, compare_at, tmp_path / "again"), first_params)
    step, _ = final_params(run)
    assert step == STEPS
