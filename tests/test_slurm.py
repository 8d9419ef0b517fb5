"""`t5x-lite launch slurm` against a real SLURM: a local cluster (slurmctld, slurmd, munged)
runs 2-task jobs, each a data-parallel run of 2 JAX processes joined over gloo.

Skipped where the cluster cannot start (not root, slurm-wlm/munge missing) unless
T5X_LITE_REQUIRE_SLURM=1 (set by .ci/run), which makes that a failure.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli_helpers import ROOT, TINY_MODEL, cli_env, losses
from tests.slurm_cluster import LocalSlurmCluster, unavailable_reason
from tests.test_cli_run import assert_trees_equal, final_params

pytestmark = pytest.mark.slurm

STEPS = 24
RUN = ["--gin_file=runs/quickstart.gin", *TINY_MODEL, f"--gin.TRAIN_STEPS={STEPS}", "--gin.train.log_period=1",
       "--gin.train.checkpoint_period=8", "--gin.OptimizerConfig.warmup_steps=2",
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


def test_two_process_job_trains_checkpoints_and_resumes_exactly(cluster, small_data_dir, tmp_path):
    """A straight job, and a job stopped by `scancel --signal=TERM` then submitted again, end
    with the same parameters bit for bit; both processes joined, and the loss fell."""
    straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
    job = submitted_job(launch(cluster, small_data_dir, straight))
    result = cluster.wait(job, timeout=300)
    out = job_output(straight, job)
    assert (result.state, result.exit_code) == ("COMPLETED", 0), out[-3000:]
    assert "on 2 cpu device(s) in 2 processes" in out and "2 data shard(s) of 4 rows" in out, out[-3000:]
    straight_losses = losses(out)
    assert len(straight_losses) == STEPS and straight_losses[-1] < straight_losses[0] - 0.05, straight_losses
    assert out.count(f"step {STEPS}: loss=") == 1, "only process 0 writes the log"

    # Stopped by SIGTERM to both tasks after step 3's report: every process stops at one step and saves it.
    job = submitted_job(launch(cluster, small_data_dir, interrupted))
    output = interrupted.parent / f"{interrupted.name}-{job}.out"
    deadline = time.monotonic() + 240
    while not (output.exists() and "step 3: loss=" in output.read_text()):
        assert time.monotonic() < deadline, output.read_text() if output.exists() else "no output"
        time.sleep(0.2)
    cluster.run("scancel", "--signal=TERM", str(job))
    result = cluster.wait(job, timeout=240)
    out = job_output(interrupted, job)
    assert (result.state, result.exit_code) == ("FAILED", EXIT_PREEMPTED), out[-3000:]
    stopped_at = int(re.search(r"saved a checkpoint at step (\d+) and stopped", out).group(1))
    assert 3 <= stopped_at < STEPS, out[-3000:]

    job = submitted_job(launch(cluster, small_data_dir, interrupted))
    result = cluster.wait(job, timeout=300)
    out = job_output(interrupted, job)
    assert (result.state, result.exit_code) == ("COMPLETED", 0), out[-3000:]
    assert f"Resuming from the checkpoint at step {stopped_at}" in out, out[-3000:]
    assert losses(out) == straight_losses[stopped_at:]

    step_a, params_a = final_params(straight)
    step_b, params_b = final_params(interrupted)
    assert step_a == step_b == STEPS
    assert_trees_equal(params_a, params_b)
