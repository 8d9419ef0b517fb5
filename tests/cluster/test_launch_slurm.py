"""`t5x-lite launch slurm` without a cluster: the rendered sbatch script (--dry-run), the argv its
srun line really passes (run with bash against a fake `srun`), submission through a fake `sbatch`,
and bad input (exit 2, nothing written, nothing submitted). tests/cluster/test_slurm.py runs real jobs.

Most cases call the CLI's `main` in this process (about 10 ms each, against 2 s for a Python
subprocess that imports JAX); a few run `python -m t5x_lite.cli` end to end.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.test_bad_input import assert_bad_input
from tests.cli_helpers import ROOT, cli_env, run_cli, run_cli_in_process

QUICKSTART = "--gin_file=runs/quickstart.gin"

# Stands in for srun/sbatch: appends {"argv", "cwd", "env"} as one JSON line to FAKE_LOG, prints
# FAKE_STDOUT, prints FAKE_STDERR on stderr and exits with FAKE_RC.
FAKE = """#!{python} -I
import json, os, sys
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write(json.dumps({{"argv": sys.argv[1:], "cwd": os.getcwd(), "env": dict(os.environ)}}) + "\\n")
if os.environ.get("FAKE_STDOUT"):
    print(os.environ["FAKE_STDOUT"])
if os.environ.get("FAKE_STDERR"):
    print(os.environ["FAKE_STDERR"], file=sys.stderr)
sys.exit(int(os.environ.get("FAKE_RC", "0")))
"""


class FakeBin:
    """A folder put first on PATH, holding fake `srun` and `sbatch` that record their calls."""

    def __init__(self, tmp_path: Path):
        self.dir = tmp_path / "bin"
        self.dir.mkdir()
        self.log = tmp_path / "fake.log"
        for name in ("srun", "sbatch"):
            path = self.dir / name
            path.write_text(FAKE.format(python=sys.executable))
            path.chmod(0o755)

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a subprocess that finds the fakes first on PATH."""
        env = cli_env()
        env.update(PATH=f"{self.dir}{os.pathsep}{env['PATH']}", FAKE_LOG=str(self.log), **extra)
        return env

    def install(self, monkeypatch, **extra: str) -> None:
        """Puts the fakes first on this process's PATH (for `cli`, whose sbatch call inherits it)."""
        for key, value in self.env(**extra).items():
            if key in ("PATH", "FAKE_LOG") or key.startswith("FAKE_"):
                monkeypatch.setenv(key, value)

    def calls(self) -> list[dict]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]


@pytest.fixture
def fake(tmp_path) -> FakeBin:
    return FakeBin(tmp_path)


def launch(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`python -m t5x_lite.cli launch slurm ARGS` in a subprocess, from the repository root."""
    if env is None:
        return run_cli("launch", "slurm", *args, timeout=120)
    return subprocess.run([sys.executable, "-m", "t5x_lite.cli", "launch", "slurm", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def model_dir_flag(model_dir: Path) -> str:
    return f"--gin.MODEL_DIR='{model_dir}'"


def sbatch_lines(script: str) -> list[str]:
    return [line for line in script.splitlines() if line.startswith("#SBATCH ")]


def exports(script: str) -> dict[str, str]:
    pairs = [line.removeprefix("export ").split("=", 1) for line in script.splitlines() if line.startswith("export ")]
    assert len({k for k, _ in pairs}) == len(pairs), pairs  # each variable exported once
    return dict(pairs)


def srun_line(script: str) -> str:
    (line,) = [line for line in script.splitlines() if line.startswith("srun ")]
    return line


GPU_JOB = ["--nodes=2", "--gpus_per_node=8", "--partition=gpu", "--account=acct", "--time=02:00:00",
           "--container_image=nvcr.io/nvidia/jax:24.04-py3", "--container_mounts=/shared:/shared",
           "--env=NCCL_DEBUG=INFO", "--sbatch=--qos=high"]


def slurm(*args: str) -> subprocess.CompletedProcess:
    """`t5x-lite launch slurm ARGS` in this process."""
    return run_cli_in_process("launch", "slurm", *args)


@pytest.fixture(scope="module")
def gpu_dry_run(tmp_path_factory):
    """(model dir, result) of a --dry-run of a 2-node, 8-GPU-per-node job in a container, run end
    to end through `python -m t5x_lite.cli`."""
    model_dir = tmp_path_factory.mktemp("gpu") / "run"
    result = launch(QUICKSTART, model_dir_flag(model_dir), *GPU_JOB, "--dry-run")
    return model_dir, result


# -- the rendered script -------------------------------------------------------------------------------

def test_dry_run_of_a_gpu_job_prints_the_script_and_writes_nothing(gpu_dry_run):
    model_dir, result = gpu_dry_run
    assert result.returncode == 0, result.stderr[-3000:]
    script = result.stdout
    assert script.startswith("#!/bin/bash\n")
    assert "{{" not in script and "}}" not in script
    lines = sbatch_lines(script)
    for expected in ("--nodes=2", "--ntasks-per-node=8", "--gpus-per-node=8", "--partition=gpu", "--account=acct",
                     "--time=02:00:00", "--qos=high", "--signal=TERM@300"):
        assert f"#SBATCH {expected}" in lines, (expected, lines)
    assert not any(line.startswith("#SBATCH --cpus-per-task") for line in lines), lines  # unset: SLURM's default
    assert not model_dir.exists() and not model_dir.parent.joinpath("slurm").exists()
    assert list(model_dir.parent.iterdir()) == []


def test_dry_run_in_process_matches_the_cli(gpu_dry_run):
    model_dir, result = gpu_dry_run
    assert slurm(QUICKSTART, model_dir_flag(model_dir), *GPU_JOB, "--dry-run").stdout == result.stdout


def test_dry_run_exports_gpu_settings_with_env_overrides(gpu_dry_run):
    script = gpu_dry_run[1].stdout
    env = exports(script)
    assert "--xla_gpu_enable_latency_hiding_scheduler=true" in env["XLA_FLAGS"]
    assert env["NCCL_DEBUG"] == "INFO"  # --env replaced the default WARN
    assert "JAX_PLATFORMS" not in env


def test_dry_run_runs_srun_in_the_container(gpu_dry_run):
    line = srun_line(gpu_dry_run[1].stdout)
    argv = line.split()
    assert argv[0] == "srun" and "--kill-on-bad-exit=1" not in argv  # see docs/launch.md: tasks finish their save
    assert "--container-image=nvcr.io/nvidia/jax:24.04-py3" in argv
    assert "--container-mounts=/shared:/shared" in argv
    assert f"--container-workdir={ROOT}" in argv
    # In a container, the image's python runs the training module with the run's gin flags.
    start = argv.index("python")
    assert argv[start:start + 4] == ["python", "-m", "t5x_lite.train", QUICKSTART]


def test_rendered_script_is_valid_bash(gpu_dry_run, tmp_path):
    script = tmp_path / "job.sbatch"
    script.write_text(gpu_dry_run[1].stdout)
    check = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr


def test_one_task_per_node_drives_all_gpus(tmp_path):
    result = slurm(QUICKSTART, model_dir_flag(tmp_path / "run"), "--nodes=2", "--gpus_per_node=8",
                   "--tasks_per_node=1", "--dry-run")
    assert result.returncode == 0, result.stderr[-3000:]
    lines = sbatch_lines(result.stdout)
    assert "#SBATCH --ntasks-per-node=1" in lines and "#SBATCH --gpus-per-node=8" in lines, lines
    assert "1 task(s)" in result.stdout
    assert not (tmp_path / "run").exists()


def test_cpu_job(tmp_path):
    result = slurm(QUICKSTART, model_dir_flag(tmp_path / "run"), "--nodes=2", "--cpus_per_task=4",
                   "--job_name=cpu_run", "--dry-run")
    assert result.returncode == 0, result.stderr[-3000:]
    lines = sbatch_lines(result.stdout)
    assert not any("gpus" in line for line in lines), lines
    for expected in ("--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=4", "--job-name=cpu_run",
                     "--time=04:00:00"):
        assert f"#SBATCH {expected}" in lines, (expected, lines)
    env = exports(result.stdout)
    assert env["JAX_PLATFORMS"] == "cpu" and "XLA_FLAGS" not in env and "NCCL_DEBUG" not in env, env
    assert "--container" not in srun_line(result.stdout)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("time", ["100", "120:00", "2-00", "1-12:30:00", "04:00:00"])
def test_slurm_time_formats_are_accepted(time, tmp_path):
    result = slurm(QUICKSTART, model_dir_flag(tmp_path / "run"), "--nodes=1", f"--time={time}", "--dry-run")
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"#SBATCH --time={time}" in sbatch_lines(result.stdout)


def test_values_are_rendered_unchanged(tmp_path):
    """Blank lines inside a value survive (only empty placeholder lines are dropped)."""
    result = slurm(QUICKSTART, model_dir_flag(tmp_path / "run"), "--nodes=1", "--env=X=a\n\n\nb", "--dry-run")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "export X='a\n\n\nb'" in result.stdout


# -- running the rendered script against a fake srun ---------------------------------------------------------

def test_srun_gets_the_gin_flags_exactly_as_given(fake, tmp_path):
    """Spaces, quotes, $ and backticks in gin values and the Python path survive the script's
    shell word for word, and nothing in them is expanded; the script exits with srun's code."""
    gin_flags = [QUICKSTART,
                 f"--gin.MODEL_DIR=\"{tmp_path}/a b/it's\"",
                 "--gin.train.sample_prompt='it\\'s \"x\" $HOME `touch pwned` ; exit 3'",
                 "--gin.TRAIN_STEPS=7"]
    python = "/opt/my python/bin/python3"
    result = slurm(*gin_flags, "--nodes=1", f"--python={python}", "--env=EXTRA=a b $HOME", "--dry-run")
    assert result.returncode == 0, result.stderr[-3000:]
    script = tmp_path / "job.sbatch"
    script.write_text(result.stdout)

    for rc in (0, 75, 3):
        fake.log.unlink(missing_ok=True)
        env = {**fake.env(FAKE_RC=str(rc)), "SLURM_JOB_ID": "977", "SLURM_JOB_NODELIST": "node[001-002]"}
        run = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=60)
        assert run.returncode == rc, (rc, run.stdout, run.stderr)
        (call,) = fake.calls()
        assert call["argv"] == [python, "-m", "t5x_lite.train", *gin_flags], call["argv"]
        assert call["cwd"] == str(ROOT)
        assert call["env"]["EXTRA"] == "a b $HOME" and call["env"]["JAX_PLATFORMS"] == "cpu"
        assert "job 977 on node[001-002]: 1 node(s) x 1 task(s)" in run.stdout
        assert ("submit the job again to resume" in run.stdout) == (rc == 75), run.stdout
    assert not (ROOT / "pwned").exists() and not (tmp_path / "pwned").exists()


# -- submission through a fake sbatch -------------------------------------------------------------------------

def test_submit_writes_the_script_and_calls_sbatch(fake, tmp_path):
    model_dir = tmp_path / "run"
    args = [QUICKSTART, model_dir_flag(model_dir), "--nodes=2", "--gpus_per_node=8"]
    dry = slurm(*args, "--dry-run")
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert not model_dir.exists()

    result = launch(*args, env=fake.env(FAKE_STDOUT="12345;cluster"))  # end to end: the CLI's exit code
    assert result.returncode == 0, result.stderr[-3000:]
    script = model_dir / "slurm" / "job.sbatch"
    assert script.read_text() == dry.stdout
    (call,) = fake.calls()
    assert call["argv"] == ["--parsable", str(script)]
    assert "submitted job 12345:" in result.stdout and "12345;cluster" not in result.stdout, result.stdout
    assert "2 node(s) x 8 process(es)" in result.stdout and str(script) in result.stdout


def test_script_flag_chooses_where_the_script_goes(fake, tmp_path, monkeypatch):
    fake.install(monkeypatch, FAKE_STDOUT="777")
    script = tmp_path / "jobs" / "mine.sbatch"
    result = slurm(QUICKSTART, model_dir_flag(tmp_path / "run"), "--nodes=1", f"--script={script}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "submitted job 777:" in result.stdout
    assert [c["argv"] for c in fake.calls()] == [["--parsable", str(script)]]
    assert script.read_text().startswith("#!/bin/bash\n") and not (tmp_path / "run").exists()


def test_failed_sbatch_exits_1_with_its_message(fake, tmp_path, monkeypatch):
    fake.install(monkeypatch, FAKE_RC="1", FAKE_STDERR="sbatch: error: invalid partition specified: gpu")
    result = slurm(QUICKSTART, model_dir_flag(tmp_path / "run"), "--nodes=1", "--partition=gpu")
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "sbatch failed" in result.stderr and "invalid partition specified: gpu" in result.stderr, result.stderr
    assert "submitted job" not in result.stdout
    assert len(fake.calls()) == 1


# -- bad input ----------------------------------------------------------------------------------------------

BAD_INPUT = {
    "batch does not divide over the nodes": (
        ["--nodes=3"], ["BATCH_SIZE (train)=16", "3 processes", "--nodes=2"]),
    "batch does not divide over the GPUs": (
        ["--nodes=3", "--gpus_per_node=8"], ["BATCH_SIZE (train)=16", "24 processes", "--nodes=2"]),
    "tasks per node neither 1 nor the GPUs": (
        ["--nodes=1", "--tasks_per_node=3", "--gpus_per_node=8"], ["--tasks_per_node=3", "use 8", "or 1"]),
    "tensor axis on one CPU device": (
        ["--nodes=1", "--gin_file=mesh/fsdp_tensor.gin"], ["On 1 devices", "MESH_AXES", "multiple of 2"]),
    "mesh that needs 3 devices on 16": (
        ["--nodes=2", "--gpus_per_node=8", "--gin.MESH_AXES=[('replica', 1), ('data', 3), ('fsdp', 1), ('tensor', 1)]"],
        ["On 16 devices", "need exactly 3 devices", "set one axis to -1"]),
    "no --nodes": (["--gpus_per_node=8"], ["--nodes is required"]),
    "zero nodes": (["--nodes=0"], ["--nodes=0", "at least one node"]),
    "non-integer nodes": (["--nodes=two"], ["--nodes='two'", "not an integer"]),
    "negative GPUs": (["--nodes=1", "--gpus_per_node=-1"], ["--gpus_per_node=-1"]),
    "unknown flag": (["--nodes=1", "--gpus=8"], ["Unknown flag --gpus"]),
    "positional argument": (["--nodes=1", "train"], ["Unknown argument 'train'"]),
    "bad time": (["--nodes=1", "--time=forever"], ["--time='forever'", "04:00:00"]),
    "zero tasks per node": (["--nodes=1", "--tasks_per_node=0", "--gpus_per_node=8"], ["--tasks_per_node=0", "at least 1"]),
    "negative cpus per task": (["--nodes=1", "--cpus_per_task=-2"], ["--cpus_per_task=-2", "at least 1"]),
    "job name with a newline": (["--nodes=1", "--job_name=x\n#SBATCH --exclusive"], ["--job_name=", "newlines"]),
    "job name with a space": (["--nodes=1", "--job_name=a b"], ["--job_name='a b'", "spaces"]),
    "sbatch option that is not one": (["--nodes=1", "--sbatch=qos=high"], ["--sbatch='qos=high'", "--sbatch=--qos=high"]),
    "bad env": (["--nodes=1", "--env=NCCL_DEBUG"], ["--env='NCCL_DEBUG'", "--env=KEY=VALUE"]),
    "missing template": (["--nodes=1", "--template=/nonexistent/t.sbatch"], ["--template=/nonexistent/t.sbatch"]),
    "no MODEL_DIR": (["--nodes=1", "--gin.MODEL_DIR=None"], ["no MODEL_DIR", "--gin.MODEL_DIR="]),
    "unknown gin binding": (["--nodes=1", "--gin.DecoderConfig.num_layer=2"], ["num_layer", "Did you mean num_layers"]),
}


@pytest.mark.parametrize("case", BAD_INPUT)
def test_bad_input_submits_nothing(case, fake, tmp_path, monkeypatch):
    fake.install(monkeypatch, FAKE_STDOUT="12345")
    args, phrases = BAD_INPUT[case]
    model_dir = tmp_path / "run"
    result = slurm(QUICKSTART, model_dir_flag(model_dir), *args)
    assert_bad_input(result, *phrases)
    assert fake.calls() == []
    assert not model_dir.exists()
    assert "submitted" not in result.stdout


def test_bad_input_through_the_cli(fake, tmp_path):
    model_dir = tmp_path / "run"
    result = launch(QUICKSTART, model_dir_flag(model_dir), "--nodes=3", "--gpus_per_node=8", env=fake.env())
    assert_bad_input(result, "BATCH_SIZE (train)=16", "--nodes=2")
    assert fake.calls() == [] and not model_dir.exists()


def test_no_gin_file(fake, monkeypatch):
    fake.install(monkeypatch)
    assert_bad_input(slurm("--nodes=1"), "--gin_file")
    assert fake.calls() == []


def test_launch_without_a_target_exits_2():
    result = run_cli_in_process("launch")
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "slurm" in result.stdout + result.stderr
    assert_bad_input(run_cli_in_process("launch", "kubernetes"), "unknown launch target 'kubernetes'")


def test_launch_slurm_help():
    result = launch("--help")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "--nodes=N" in result.stdout and "--dry-run" in result.stdout and "--gpus_per_node" in result.stdout
    assert re.search(r"Exit codes: 0 .*, 2 bad input", result.stdout)
