"""`t5x-lite launch slurm`: render launch/slurm/train.sbatch for a gin run and submit it.

    t5x-lite launch slurm --gin_file=runs/pretrain.gin ... --nodes=4 --gpus_per_node=8 [--dry-run]

The run's config is read and checked first (the batch against the processes and the mesh
against the devices), so a job that cannot work is never queued.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Mapping, Sequence

from t5x_lite import errors, storage
from t5x_lite.config import parsing
from t5x_lite.config import resolve as config_resolve
from t5x_lite.errors import ConfigValueError
from t5x_lite.estimate import layout, run_from_gin

TEMPLATE = Path(__file__).resolve().parents[2] / "launch" / "slurm" / "train.sbatch"

USAGE = """usage: t5x-lite launch slurm --gin_file=FILE [--gin_file=...] [--gin.KEY=VALUE ...] --nodes=N
                             [--gpus_per_node=G] [--tasks_per_node=T] [--partition=P] [--account=A]
                             [--time=HH:MM:SS] [--job_name=NAME] [--output=PATH] [--cpus_per_task=C]
                             [--container_image=IMAGE] [--container_mounts=SRC:DST[,...]]
                             [--env=KEY=VALUE ...] [--sbatch=--FLAG=VALUE ...] [--python=PATH]
                             [--signal_seconds=S] [--template=FILE] [--script=PATH] [--dry-run]

Renders launch/slurm/train.sbatch for the gin run and submits it with sbatch (prints the job
id), or with --dry-run prints the script and submits nothing.

  --nodes=N            nodes of the job
  --gpus_per_node=G    GPUs per node (0: a CPU job; default 0)
  --tasks_per_node=T   JAX processes per node: G (one per GPU, the default) or 1 (one per node,
                       each driving all of the node's GPUs); CPU jobs default to 1
  --partition, --account, --time (default 04:00:00), --job_name (default t5x_lite),
  --output (default slurm-%x-%j.out), --cpus_per_task (default: unset, SLURM's default)
  --container_image    run the tasks in this image (pyxis/enroot: srun --container-image)
  --container_mounts   srun --container-mounts (e.g. /shared:/shared)
  --env=KEY=VALUE      export KEY=VALUE in the job (repeatable; replaces a default)
  --sbatch=FLAG        an extra #SBATCH line, e.g. --sbatch=--qos=high (repeatable)
  --python=PATH        the job's Python (default: this one, or `python` in a container)
  --signal_seconds=S   SIGTERM the tasks S seconds before the time limit (default 300)
  --template=FILE      another sbatch template with the same {{placeholders}}
  --script=PATH        where the rendered script is written (default MODEL_DIR/slurm/job.sbatch)
  --dry-run            print the rendered script; submit nothing

Exit codes: 0 submitted (or printed), 2 bad input (nothing submitted), 1 sbatch failed.
"""

# Settings that matter on GPUs, exported unless --env sets them (docs/launch.md explains each).
GPU_ENVIRONMENT = {
    "XLA_FLAGS": "--xla_gpu_enable_latency_hiding_scheduler=true",
    "XLA_CLIENT_MEM_FRACTION": "0.90",
    "NCCL_DEBUG": "WARN",
}
CPU_ENVIRONMENT = {"JAX_PLATFORMS": "cpu"}


@dataclasses.dataclass(frozen=True)
class SlurmJob:
    """What the job asks SLURM for and runs."""

    nodes: int
    gpus_per_node: int = 0
    tasks_per_node: int | None = None
    partition: str | None = None
    account: str | None = None
    time: str = "04:00:00"
    job_name: str = "t5x_lite"
    output: str = "slurm-%x-%j.out"
    cpus_per_task: int | None = None
    container_image: str | None = None
    container_mounts: str | None = None
    env: tuple[tuple[str, str], ...] = ()
    sbatch: tuple[str, ...] = ()
    python: str | None = None
    signal_seconds: int = 300

    @property
    def processes_per_node(self) -> int:
        return self.tasks_per_node or self.gpus_per_node or 1

    @property
    def num_processes(self) -> int:
        return self.nodes * self.processes_per_node

    @property
    def num_devices(self) -> int:
        """Devices of the whole job: every GPU, or one CPU device per process."""
        return self.nodes * (self.gpus_per_node or self.processes_per_node)


def check_job(job: SlurmJob) -> None:
    """Raises ConfigValueError for sizes that cannot work."""
    if job.nodes < 1:
        raise ConfigValueError(f"--nodes={job.nodes}: a job needs at least one node.")
    if job.gpus_per_node < 0:
        raise ConfigValueError(f"--gpus_per_node={job.gpus_per_node} must be 0 (CPU) or more.")
    if job.tasks_per_node is not None and job.tasks_per_node < 1:
        raise ConfigValueError(f"--tasks_per_node={job.tasks_per_node} must be at least 1.")
    if job.cpus_per_task is not None and job.cpus_per_task < 1:
        raise ConfigValueError(f"--cpus_per_task={job.cpus_per_task} must be at least 1.")
    tasks = job.processes_per_node
    if job.gpus_per_node and tasks not in (1, job.gpus_per_node):
        raise ConfigValueError(
            f"--tasks_per_node={tasks} with --gpus_per_node={job.gpus_per_node}: use {job.gpus_per_node} "
            "(one process per GPU) or 1 (one process per node driving all its GPUs).")
    if not re.fullmatch(r"(\d+-)?\d+(:\d{1,2}){0,2}", job.time):
        raise ConfigValueError(f"--time={job.time!r}: use SLURM's format, e.g. 04:00:00, 90 (minutes) or 2-00:00:00.")
    for name in ("job_name", "output", "partition", "account"):
        value = getattr(job, name)
        if value is not None and (not value or re.search(r"\s", value)):
            raise ConfigValueError(f"--{name}={value!r}: an #SBATCH value cannot be empty or contain spaces or newlines.")
    for flag in job.sbatch:
        if not flag.startswith("-") or "\n" in flag:
            raise ConfigValueError(f"--sbatch={flag!r}: give one sbatch option, e.g. --sbatch=--qos=high.")
    if job.signal_seconds < 1:
        raise ConfigValueError(f"--signal_seconds={job.signal_seconds} must be positive.")


def check_run_fits(settings, job: SlurmJob, eval_batch_size: int | None) -> None:
    """The batch divides over the job's processes and the mesh fits its devices, or a
    ConfigValueError naming the sizes (the checks train makes, before anything is queued)."""

    where = (f"{job.nodes} node(s) x {job.processes_per_node} process(es) = {job.num_processes} processes")
    for name, batch in (("BATCH_SIZE (train)", settings.train_data.batch_size), ("eval batch_size", eval_batch_size)):
        if batch is not None and batch % job.num_processes:
            raise ConfigValueError(
                f"{name}={batch} does not divide over {where}; choose a node count whose processes divide "
                f"the batch (e.g. --nodes={_nodes_that_fit(batch, job)}) or change the batch size.")
    try:
        layout.check_layout(settings, num_devices=job.num_devices)
    except ConfigValueError as e:
        raise ConfigValueError(f"On {job.num_devices} devices ({where}): {e}") from None


def _nodes_that_fit(batch: int, job: SlurmJob) -> int:
    return max((n for n in range(1, job.nodes + 1) if batch % (n * job.processes_per_node) == 0), default=1)


def render(template: str, values: Mapping[str, str]) -> str:
    """Fills every {{name}} of `template`; an unknown or unfilled name is an error.

    A line that is only a placeholder, or an #SBATCH line, whose value is empty is left out
    (no blank line, no `#SBATCH --cpus-per-task=` without a value).
    """
    names = set(re.findall(r"\{\{(\w+)\}\}", template))
    missing = names - set(values)
    if missing:
        raise ConfigValueError(f"The sbatch template has placeholders the launcher does not fill: {sorted(missing)}.")
    lines = []
    for line in template.splitlines(keepends=True):
        used = re.findall(r"\{\{(\w+)\}\}", line)
        optional = line.startswith("#SBATCH") or (len(used) == 1 and line.strip() == f"{{{{{used[0]}}}}}")
        if used and optional and not all(values[name] for name in used):
            continue
        lines.append(re.sub(r"\{\{(\w+)\}\}", lambda m: values[m.group(1)], line))
    return "".join(lines)


def script_values(job: SlurmJob, *, train_args: Sequence[str], workdir: str) -> dict[str, str]:
    """The placeholders' values for `job` running `t5x-lite train TRAIN_ARGS`."""
    sbatch = [f"#SBATCH --partition={job.partition}"] if job.partition else []
    sbatch += [f"#SBATCH --account={job.account}"] if job.account else []
    sbatch += [f"#SBATCH --gpus-per-node={job.gpus_per_node}"] if job.gpus_per_node else []
    sbatch += [f"#SBATCH {flag}" for flag in job.sbatch]
    environment = dict(GPU_ENVIRONMENT if job.gpus_per_node else CPU_ENVIRONMENT)
    environment.update(dict(job.env))
    python = job.python or ("python" if job.container_image else sys.executable)
    srun = []
    if job.container_image:
        srun.append(f"--container-image={shlex.quote(job.container_image)}")
        if job.container_mounts:
            srun.append(f"--container-mounts={shlex.quote(job.container_mounts)}")
        srun.append(f"--container-workdir={shlex.quote(workdir)}")
    command = [python, "-m", "t5x_lite.train", *train_args]
    return {
        "job_name": job.job_name, "nodes": str(job.nodes), "tasks_per_node": str(job.processes_per_node),
        "cpus_per_task": str(job.cpus_per_task) if job.cpus_per_task else "",
        "time": job.time, "output": job.output, "signal_seconds": str(job.signal_seconds),
        "sbatch_lines": "\n".join(sbatch), "workdir": shlex.quote(workdir),
        "environment": "\n".join(f"export {k}={shlex.quote(v)}" for k, v in environment.items()),
        "srun_args": " ".join(srun), "command": " ".join(shlex.quote(c) for c in command),
    }


def render_script(job: SlurmJob, *, train_args: Sequence[str], workdir: str, template: str) -> str:
    return render(template, script_values(job, train_args=train_args, workdir=workdir))


def parse_flags(args: Sequence[str]) -> tuple[SlurmJob, dict[str, str | bool]]:
    """(the job, the launcher's own options: template, script, dry_run) from the flags."""
    job_fields = {f.name: f for f in dataclasses.fields(SlurmJob)}
    values: dict[str, object] = {}
    env: list[tuple[str, str]] = []
    sbatch: list[str] = []
    own: dict[str, str | bool] = {"dry_run": False}
    for arg in args:
        if arg in ("--dry-run", "--dry_run"):
            own["dry_run"] = True
            continue
        name, eq, value = arg.removeprefix("--").partition("=")
        if not arg.startswith("--") or not eq:
            raise ConfigValueError(f"Unknown argument {arg!r}; flags are --NAME=VALUE.\n{USAGE}")
        if name == "env":
            key, eq, val = value.partition("=")
            if not eq or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                raise ConfigValueError(f"--env={value!r}: use --env=KEY=VALUE.")
            env.append((key, val))
        elif name == "sbatch":
            sbatch.append(value)
        elif name in ("template", "script"):
            own[name] = value
        elif name in job_fields and name not in ("env", "sbatch"):
            if job_fields[name].type in ("int", "int | None"):
                try:
                    values[name] = int(value)
                except ValueError:
                    raise ConfigValueError(f"--{name}={value!r} is not an integer.") from None
            else:
                values[name] = value
        else:
            raise ConfigValueError(f"Unknown flag --{name}.\n{USAGE}")
    if "nodes" not in values:
        raise ConfigValueError(f"--nodes is required.\n{USAGE}")
    job = SlurmJob(**values, env=tuple(env), sbatch=tuple(sbatch))
    check_job(job)
    return job, own


def main(argv: Sequence[str]) -> int:
    argv = list(argv)
    if any(a in ("-h", "--help") for a in argv) or not argv:
        print(USAGE)
        return 0 if argv else 2
    with errors.reported():
        files, bindings, paths, rest = parsing.split_gin_flags(argv)
        job, own = parse_flags(rest)
        if not files:
            raise ConfigValueError(f"Give the run's --gin_file(s).\n{USAGE}")
        resolved = config_resolve.load_run(gin_files=files, gin_bindings=bindings, gin_search_paths=paths,
                                           entry="train", check_macros=True)
        settings = run_from_gin.run_settings(resolved)
        model_dir = settings.model_dir
        if model_dir in (None, config_resolve.REQUIRED):
            raise ConfigValueError("The run has no MODEL_DIR; set --gin.MODEL_DIR=\"'/shared/runs/NAME'\" (a path "
                                   "every node can reach).")
        check_run_fits(settings, job, getattr(settings.eval_data, "batch_size", None))
        template_path = Path(own.get("template") or TEMPLATE)
        if not template_path.is_file():
            raise ConfigValueError(f"--template={template_path}: no such file.")
        train_args = [f"--gin_file={f}" for f in files]
        train_args += ["--gin.{}={}".format(*b.split(" = ", 1)) for b in bindings]
        train_args += [f"--gin_search_paths={','.join(paths)}"] if paths else []
        script = render_script(job, train_args=train_args, workdir=os.getcwd(), template=template_path.read_text())
        if own["dry_run"]:
            print(script, end="")
            return 0
        script_path = Path(own.get("script") or storage.join(storage.absolute(model_dir), "slurm", "job.sbatch"))
        if storage.is_url(str(script_path)):
            raise ConfigValueError(f"MODEL_DIR is {model_dir}: give --script=PATH on a shared disk for the sbatch file.")
        script_path.parent.mkdir(parents=True, exist_ok=True)
        script_path.write_text(script)
    try:
        result = subprocess.run(["sbatch", "--parsable", str(script_path)], capture_output=True, text=True)
    except FileNotFoundError:
        print(f"error: sbatch not found: run this on a SLURM login node (the script is {script_path}).",
              file=sys.stderr)
        return 1
    if result.returncode != 0:
        print(f"error: sbatch failed ({result.returncode}): {result.stderr.strip()} (script: {script_path})",
              file=sys.stderr)
        return 1
    job_id = result.stdout.strip().split(";")[0]
    print(f"submitted job {job_id}: {job.nodes} node(s) x {job.processes_per_node} process(es); script {script_path}")
    return 0
