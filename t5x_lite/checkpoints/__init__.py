"""Checkpoints: saving and restoring a run's state, and reading a trained model back.

Owns:
  checkpoint.py      `Checkpointer` (Orbax, async saves committed with a manifest, read-only readers,
                     restore of the newest good step, damaged steps moved aside), `to_saveable`
  compatibility.py   whether a checkpoint fits this run: model fields and train-state arrays
  manifest.py        size + CRC32C of every file of a step, written at commit, checked before a read
  lookup.py          `locate`: the step a reader asked for, or the newest good one (never writes)
  lease.py           one writer per model directory: `Lease`, `unlock`; lease_store.py: its storage
  verify.py          every step's state; `t5x-lite checkpoint verify`
  command.py         `t5x-lite checkpoint info|verify|unlock`
  retention.py       `RetentionPolicy`: last N, every K-th step, best N by a metric (pure)
  s3_mirror.py       s3:// model directories: a local staging copy uploaded with a COMMITTED marker
  init_from.py       `InitFrom`: a new run's parameters from another run, through a name mapping, and
                     the source's Hugging Face files (hf/: tokenizer, config.json) copied to the run
  restored_model.py  a checkpoint's model config, float32 params and vocabulary for eval and inference
  info.py            `t5x-lite checkpoint info PATH`

Public names: `checkpoint.Checkpointer`, `checkpoint.to_saveable`, `checkpoint.check_compatible`,
`checkpoint.checkpoints_dir`; `lookup.locate`, `lookup.CheckpointNotFoundError`,
`lookup.DamagedCheckpointError`; `lease.Lease`, `lease.live_holder`; `manifest.check`, `manifest.write`;
`retention.RetentionPolicy`; `init_from.InitFrom`, `resolve`, `load_params`, `copy_hf_files`,
`flatten`, `unflatten`; `restored_model.restore`, `RestoredModel`, `run_vocabulary`.

May import (pyproject.toml's layers contract): data, parallel, metrics, models, storage, errors,
tf_setup.
"""
