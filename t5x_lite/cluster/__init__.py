"""Cluster launching: starting a run on several machines.

Owns:
  command.py  `t5x-lite launch <target>` (one target: slurm; Cloud TPU slices use launch/tpu/)
  slurm.py    `t5x-lite launch slurm`: the run checked against the job's processes and devices,
              launch/slurm/train.sbatch rendered and submitted (`--dry-run` prints it)

Public names: `command.main` (cli.py); nothing else is imported from outside.

May import (pyproject.toml's layers contract): estimate, config, training, evaluation, inference,
checkpoints, data, parallel, metrics, models, storage, errors, tf_setup. Not hf, its sibling on
the same layer.
"""
