"""Configuration: gin flags and files, the configurables they bind, and where each value came from.

Owns:
  parsing.py        `--gin_file` / `--gin.K=V` / `--gin_search_paths`, search paths, `parse`, `ConfigError`
  registry.py       the configurables a gin file may bind (`train`, `DecoderConfig`, `lm_task`, ...)
  renames.py        configurables and parameters since renamed, and their successors (for parsing's errors)
  sources.py        every binding of a run in the order gin applies it, with its file:line or flag
  resolve.py        the run followed from its entry point without calling it: each call's values,
                    what overrode what, unused bindings, undefined macros; deferred calls for estimate
  macro_defaults.py macros a run may leave unset (MESH_AXES: no mesh file; DROPOUT_RATE) and the
                    check that a macro and its t5x alias (SEED / RANDOM_SEED, MODEL_DIR / CHECKPOINT_PATH) agree
  t5x_macros.py     t5x's macros as data: the parameters each sets here, or its refusal naming the equivalent
  command.py        `t5x-lite config show | explain | diff | reference`; the unused-binding warning
  reference.py      docs/config_reference.md, generated from signatures and docstrings (`--check`)
  entry.py          the shared body of `train`, `eval` and `infer`: parse, warn, join processes, call;
                    t5x's --seqio_additional_cache_dirs
  cache_command.py  `t5x-lite cache`: registers the tasks a gin config names, runs data/preparation/cache.py

Public names: `parsing.parse`, `parsing.split_gin_flags`, `parsing.ConfigError`, `resolve.load_run`,
`resolve.REQUIRED`, `resolve.DeferredCall`, `entry.run` (train.py, eval.py, infer.py), and the
`cache` and `config` commands that cli.py imports by name.

May import (pyproject.toml's layers contract): training, evaluation, inference, checkpoints,
data, parallel, metrics, models, storage, errors, tf_setup. Not estimate, cluster, hf or the
entry points.
"""
