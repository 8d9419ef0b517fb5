"""Estimates: parameters, FLOPs, tokens, memory per device and time to train, before any compute.

Owns:
  command.py       `t5x-lite estimate`: its flags, `estimate` (every number of the result), `main`
  run_from_gin.py  the run `train` would start, read from a resolved gin config without calling it
                   (task factories deferred: no data needed)
  epoch.py         tokens and steps per epoch from a prepared directory's metadata.json
  layout.py        the mesh on a given device count and the shards per logical axis; `check_layout`
  memory.py        memory per device: the train state by arithmetic, activations roughly, or
                   XLA's analysis of the compiled step (`--compile`)
  collectives.py   the collectives of a compiled program from its HLO text, per scanned loop (pure;
                   bench large_models and tests read it)
  report.py        the human-readable report (formatting only)
  arithmetic.py    pure functions: mesh shapes, shards per array, FLOPs split, steps per epoch,
                   time to train, activation and logits bytes (docs/estimate.md writes them out)
  accelerators.py  dense peak FLOP/s and memory per chip (GPUs, TPUs), with sources

Public names: `run_from_gin.run_settings` and `layout.check_layout` (cluster/slurm.py checks a
job with them); `command.main` (cli.py); `memory.compile_train_step` and `collectives.collectives`
(bench/large_models.py).

May import (pyproject.toml's layers contract): config, training, evaluation, inference,
checkpoints, data, parallel, metrics, models, storage, errors, tf_setup. Not cluster, hf or the
entry points.
"""
